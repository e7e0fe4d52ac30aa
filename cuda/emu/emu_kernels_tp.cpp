/* CUDA emulation build: cuda/kernels_tp.cu, unchanged, compiled as C++ against cuda/emu/'s headers. */
#include "../kernels_tp.cu"
