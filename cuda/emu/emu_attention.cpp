/* CUDA emulation build: cuda/attention.cu, unchanged, compiled as C++ against cuda/emu/'s headers. */
#include "../attention.cu"
