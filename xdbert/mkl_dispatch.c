/* MKL's answers on AMD Zen, given on every x86-64 CPU, so every CPU runs the same GEMM kernels.

   The MKL linked into torch's wheels picks its single-precision GEMM (every Linear layer) by asking
   two of its own functions about the CPU. On AMD Zen they answer "not an Intel CPU" and "Zen", and MKL
   runs its Zen kernel; on an Intel CPU it runs Intel's AVX2 kernel, which sums in another order, so the
   same commit trained other weights on an Intel Xeon than on AMD EPYCs (docs/reproducibility.md).

   xdbert/numerics.py loads this library with its symbols global before torch is imported. torch calls
   these functions through its PLT, so the dynamic linker finds these definitions before MKL's own. On
   AMD Zen they answer what MKL finds anyway. */

int mkl_serv_intel_cpu_true(void) { return 0; }

int mkl_serv_cpuiszen(void) { return 1; }
