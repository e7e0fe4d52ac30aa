/* CUDA emulation build: cuda/comm_nccl.cu, unchanged, compiled as C++ against cuda/emu/'s headers. */
#include "../comm_nccl.cu"
