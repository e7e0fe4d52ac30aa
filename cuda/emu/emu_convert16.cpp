/* CUDA emulation build: cuda/convert16.cu, unchanged, compiled as C++ against cuda/emu/'s headers. */
#include "../convert16.cu"
