"""Training across processes: the MPI collective, the rank's place in a job, and
the `mpiexec` launcher. Importing this package does not import mpi4py."""
