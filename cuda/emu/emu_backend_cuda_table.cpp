/* CUDA emulation build: cuda/backend_cuda_table.cu, unchanged, compiled as C++ against cuda/emu/'s headers. */
#include "../backend_cuda_table.cu"
