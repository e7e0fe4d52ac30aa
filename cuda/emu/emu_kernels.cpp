/* CUDA emulation build: cuda/kernels.cu, unchanged, compiled as C++ against cuda/emu/'s headers. */
#include "../kernels.cu"
