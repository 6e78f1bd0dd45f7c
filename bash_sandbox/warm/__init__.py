"""The warm CLI: `bash-sandbox run` through a per-user daemon that has imported the CLI once
(`BASH_SANDBOX_DAEMON=1`; see `daemon.py` for what is and is not shared)."""
