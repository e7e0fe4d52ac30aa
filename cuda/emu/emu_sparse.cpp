/* CUDA emulation build: cuda/sparse.cu, unchanged, compiled as C++ against cuda/emu/'s headers. */
#include "../sparse.cu"
