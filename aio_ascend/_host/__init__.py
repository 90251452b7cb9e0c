"""L2 host memory: the kernel-argument builder, pinned buffer pool and args snapshots."""
