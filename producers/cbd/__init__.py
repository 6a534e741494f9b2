"""Check Before Delivery (Aegis §6, CBD): test hosts in parallel just before hand-over.

73% of failed jobs die within their first 10 minutes, mostly on hosts left broken by the
previous user or by a recent update. CBD runs a check suite on every host of a batch at once
and says, per host, ``deliver`` or ``hold`` (with reason and evidence); when many hosts fail
the same check it asks for ONE ``rollback_update`` instead of isolating them all.

Layout (docs/cbd.md has the whole design):

- ``model``: CheckResult, the Check contracts, CheckContext, HostVerdict and BatchReport;
- ``config``: thresholds and requirements (TOML/JSON), the baseline file;
- ``targets``: how to reach a host (``local``, ``netns:NS``, ``ssh:HOST``) and host specs;
- ``facts`` / ``nvml_facts``: the on-host fact collector (sysfs, env, routes, NVML, kmsg);
  ``facts_view``: batch majorities and route lookups over collected facts;
- ``checks_config`` (+ ``nccl_env``) / ``checks_host`` / ``checks_multi`` + ``collective``:
  the checks of the three stages;
- ``selftest``, ``netprobe``, ``ring``, ``nccl_tests``: on-host programs and their parsers;
- ``analysis``: pure loss/bandwidth analysis and localisation of bad links and hosts;
- ``planner``: link-disjoint test groups (CBD multi-host stage and Alg. 1 OfflineDiag);
- ``verdict``: per-host verdicts, the mass-failure rule, Diagnoses and IsolationCommands;
- ``runner`` / ``profiles``: the light and full suites, run in parallel with budgets;
- ``agents`` (+ ``kafka_bus``): agents-mode messages, ``run_cbd_request``, the coordinator;
- ``report``: text rendering and baselines from a healthy run.
"""
