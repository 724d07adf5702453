/* The same kind of program for Open MPI's mpirun: MPI_Init, one barrier, MPI_Finalize. */
#include <mpi.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
