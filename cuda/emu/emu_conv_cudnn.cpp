/* CUDA emulation build: cuda/conv_cudnn.cu, unchanged but for where its cuDNN functions come from
 * (cuda/emu/cudnn.cpp's, linked in), compiled as C++ against cuda/emu/'s headers. */
#include "../conv_cudnn.cu"
