"""Collectives: `Collective` and its five operations (all_reduce,
reduce_scatter, all_gather, broadcast, barrier) on the host
(`collective.HostCollective`), in a ring of actors (`ring.RingCollective`)
and across processes through MPI (`mpi.collective.MpiCollective`), with one
partition rule (`partition.split_bounds`). Nothing here knows a model; see
docs/collectives.md."""
