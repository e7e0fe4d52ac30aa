/* `dtrain plot [-o OUT.svg] METRICS.jsonl...`: training curves of one or more runs as one SVG
 * picture (plot.c). No MPI. */
#ifndef DT_PLOT_H
#define DT_PLOT_H

/* argv[0] is "plot". Returns 0, 2 (usage or unreadable/bad input: one line naming the file and
 * line) or 1 (the picture could not be written). */
int dt_plot_main(int argc, char **argv);

#endif
