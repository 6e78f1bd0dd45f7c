/* A bounded fork bomb for the limit tests: a binary tree of processes at most DEPTH deep
 * (2^(DEPTH+1) - 1 processes at most), every node holding until its stdin reaches EOF.
 *
 * Progress goes to fd 3, one byte per event, so the watcher knows when the tree is complete
 * without sleeping: a node writes 'a'+depth when it starts (before it forks: its children's
 * bytes always come after its own), and its parent writes 'F' for a fork that failed.
 * A failed fork also prints strerror to stderr, as a shell would, and the exit status is 1.
 * Usage: forkbomb DEPTH TOKEN   (TOKEN only marks the processes for /proc scans)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Returns 1 when a fork failed in this node's subtree (the exit status carries it up). */
static int node(int depth) {
  int failed = 0;
  char byte = (char)('a' + depth);
  (void)write(3, &byte, 1);
  for (int i = 0; i < 2 && depth > 0; i++) {
    pid_t pid = fork();
    if (pid == 0) _exit(node(depth - 1));
    if (pid < 0) {
      int err = errno;
      failed = 1;
      byte = 'F';
      (void)write(3, &byte, 1);
      dprintf(2, "forkbomb: fork: %s\n", strerror(err));
    }
  }
  char c;
  while (read(0, &c, 1) > 0) {
  }
  int status;
  while (wait(&status) > 0) {
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  return failed;
}

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  int depth = atoi(argv[1]);
  if (depth < 0 || depth > 13) return 2; /* never more than 16383 processes */
  return node(depth);
}
