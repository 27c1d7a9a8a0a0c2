"""The emergency save on preemption: the agreed stop step, the exit, the launcher contract."""
