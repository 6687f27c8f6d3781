"""Scripts the MPI tests launch under mpiexec, and the harness that launches them."""
