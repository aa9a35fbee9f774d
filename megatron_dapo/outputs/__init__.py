"""What a run owns on disk: its run directory (``run_dir``: whose files are there, what a new
run may write) and its checkpoint directories (``checkpoint_dirs``: atomic steps, ``latest``,
retention). Below the driver and the launch checks, which both use it (docs/design.md, Layers)."""
