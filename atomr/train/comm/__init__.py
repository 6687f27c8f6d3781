"""Collectives: all-reduce and friends on the host, in a ring of actors, and
across processes through MPI (`atomr.train.comm.mpi`). Nothing here knows a model."""
