/* Threads, the same way in every kernel: with OpenMP, OMP(...) is a pragma and NOTE_TEAM() records
 * how many threads the calling thread's kernel call ran on (sd_team, read by the tests through
 * sd_last_team()); without OpenMP (clang without libomp) both are empty and the kernels run on the
 * calling thread alone, with the same summation order and so the same bits. */
#ifndef SD_THREADS_H
#define SD_THREADS_H
#ifdef _OPENMP
#include <omp.h>
#define OMP(...) _Pragma(#__VA_ARGS__)
#define NOTE_TEAM() do { if (omp_get_thread_num() == 0) sd_team = omp_get_num_threads(); } while (0)
#else
#define OMP(...)
#define NOTE_TEAM() ((void)0)
#endif
#endif
