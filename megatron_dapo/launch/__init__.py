"""Launching a run: the dry-run plan (``plan``, which prints ``rank_layout``,
``weight_sync_plan``, ``memory_estimate``, ``schedule`` and ``config_warnings``), Ray placement
(``placement``), node waits.

Nothing heavy is imported here: the plan's modules need no GPU and no Ray, and ``placement``
imports Ray only inside its functions. Import the submodules directly::

    from megatron_dapo.launch.plan import dry_run_report
    from megatron_dapo.launch.placement import start_ray, create_placement_group
"""
