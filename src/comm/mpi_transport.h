#pragma once
// MPI backend (Open MPI): one process per worker, `mpirun -np N loco train ...`. After
// initialization only the transport's own progress thread makes MPI calls
// (MPI_THREAD_SERIALIZED); channels map to MPI tags on a duplicate of MPI_COMM_WORLD.
#include <memory>

#include "comm/transport.h"

namespace loco {

// True if this process was started by an MPI launcher (mpirun / srun with PMI).
bool launched_by_mpi();
// Initializes MPI (once) and returns this process's endpoint.
std::unique_ptr<Transport> make_mpi_transport();
// MPI_Finalize, after every communicator is destroyed (no-op if MPI was never initialized).
void finalize_mpi();
// Rank of this process in MPI_COMM_WORLD as given by the launcher's environment (-1 if none).
int mpi_env_rank();
int mpi_env_size();
// Number of processes of this job on this host (for choosing compute threads).
int mpi_env_local_size();

}  // namespace loco
