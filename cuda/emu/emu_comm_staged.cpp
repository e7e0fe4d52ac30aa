/* CUDA emulation build: cuda/comm_staged.cu, unchanged, compiled as C++ against cuda/emu/'s headers. */
#include "../comm_staged.cu"
