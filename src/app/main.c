/* dtrain entry point: everything lives in libdtrain (src/app/cli.c). */
#include "cli.h"

int main(int argc, char **argv) { return dt_main(argc, argv); }
