// The MPI communicator behind a comm::Group, for programs that mix their own MPI calls with
// zeroshard's collectives. The only public comm header besides mpi_check.h that includes <mpi.h>.
//
//   MPI_Comm c = zs::comm::native_handle(world.group());
//   if (c != MPI_COMM_NULL) MPI_Barrier(c);
#pragma once

#include <mpi.h>

#include "comm/group.h"

namespace zs::comm {

// MPI_COMM_NULL for a local or simulated group (!group.is_mpi()). Owned by the group: do not free.
MPI_Comm native_handle(const Group& group);

}  // namespace zs::comm
