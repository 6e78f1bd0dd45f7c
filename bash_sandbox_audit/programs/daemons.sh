# Six ways to daemonise (row 11). A template: the audit fills in the python interpreter
# before running it. Each daemon's argv[0] carries the run token (taken from the
# environment, so the command's own text does not), which is how the host finds them.
T="$BASH_SANDBOX_AUDIT_RUN-dmn"
setsid bash -c "exec -a $T-setsid sleep 300" </dev/null >/dev/null 2>&1 &
nohup bash -c "exec -a $T-nohup sleep 300" </dev/null >/dev/null 2>&1 &
( bash -c "exec -a $T-doublefork sleep 300" </dev/null >/dev/null 2>&1 & )
bash -c "trap '' TERM HUP INT; exec -a $T-ignoreterm sleep 300" </dev/null >/dev/null 2>&1 &
bash -c "exec -a $T-pipeholder sleep 300" &
{{py}} -c 'import os, sys
if os.fork(): sys.exit(0)
os.setsid()
if os.fork(): os._exit(0)
fd = os.open("/dev/null", os.O_RDWR)
for n in (0, 1, 2): os.dup2(fd, n)
os.execvp("sleep", [sys.argv[1] + "-pyfork", "300"])' "$T"
disown -a 2>/dev/null
echo DAEMONS-STARTED
