"""Linux kernel mechanics the confining backends share: child setup, seccomp, namespaces."""
