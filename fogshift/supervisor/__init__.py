"""The local process supervisor: brings a cluster up on this machine and down again.

One broker (nats-server), one orchestrator and one node agent per node, each in a process
group of its own, optionally each node in a network namespace behind a relay
(:mod:`fogshift.supervisor.cluster`). The CLI (``fogshift up``/``down``/``net``), the tests and
the benchmarks all start and stop clusters through it; it sits above the services it starts
and below the CLI and the benchmarks, and imports neither.
"""
