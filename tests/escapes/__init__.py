"""The escape suite: the probes hold against wakeloop, and each is seen to fail against a weakened one."""
