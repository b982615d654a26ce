"""The GPU campaign: every lent GPU minute trains the plan, proven on the CPU before any GPU comes.

pack (here) -> launch, status, collect (on the GPU machine) -> ship (here); preflight runs the whole
cycle on the CPU. plan.py is what runs, runs.py one run, supervisor.py the window, ledger.py the record
across windows. How a window is run, command by command: docs/training/campaign.md.
"""
