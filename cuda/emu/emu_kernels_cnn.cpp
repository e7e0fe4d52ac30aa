/* CUDA emulation build: cuda/kernels_cnn.cu, unchanged, compiled as C++ against cuda/emu/'s headers. */
#include "../kernels_cnn.cu"
