/* examples/example_progress.c — progress lines with elapsed time and ETA (see the header). */
#include "examples/example_progress.h"

#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "examples/example_common.h"

const char *example_duration_text(double seconds, char *buffer, size_t size) {
    /* Rounded to the second; NaN compares false with everything and shows as 0:00. */
    long long s = seconds > 0 ? (seconds < 1e9 ? (long long)(seconds + 0.5) : 999999999LL) : 0;
    if (s >= 3600) snprintf(buffer, size, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
    else snprintf(buffer, size, "%lld:%02lld", s / 60, s % 60);
    return buffer;
}

/* The terminal's width, 80 when it does not say. */
static int terminal_columns(FILE *out) {
    struct winsize size;
    if (ioctl(fileno(out), TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
    return 80;
}

void example_progress_start_at(example_progress *p, FILE *out, bool in_place, int64_t first_epoch, int64_t epochs,
                               double now_s) {
    *p = (example_progress){.out = out, .in_place = in_place, .columns = in_place ? terminal_columns(out) : 0,
                            .epochs = epochs, .epoch = first_epoch, .run_start_s = now_s, .epoch_start_s = now_s};
}

void example_progress_start(example_progress *p, FILE *out, int64_t first_epoch, int64_t epochs) {
    example_progress_start_at(p, out, isatty(fileno(out)) == 1, first_epoch, epochs, example_seconds());
}

void example_progress_epoch_at(example_progress *p, int64_t epoch, int64_t steps, double now_s) {
    /* What came between the last epoch's training and this epoch: its evaluation and save. */
    if (p->train_end_s > 0) p->after_s = now_s - p->train_end_s;
    p->epoch = epoch;
    p->steps = steps;
    p->epoch_start_s = now_s;
    p->train_end_s = 0;
}

void example_progress_epoch(example_progress *p, int64_t epoch, int64_t steps) {
    example_progress_epoch_at(p, epoch, steps, example_seconds());
}

void example_progress_times(const example_progress *p, int64_t done, double now_s, char *buffer, size_t size) {
    double epoch_s = now_s - p->epoch_start_s;
    double left_s = done > 0 ? epoch_s / (double)done * (double)(p->steps - done) : 0;
    char elapsed[32], left[32], run[32], run_left[32];
    example_duration_text(now_s - p->run_start_s, run, sizeof run);
    if (p->epochs <= 0) {
        snprintf(buffer, size, " | run %s eta %s", run, example_duration_text(left_s, left, sizeof left));
        return;
    }
    /* The epochs after this one at this epoch's projected length, each followed by what followed
     * the last one's training (this epoch's own evaluation too). */
    int64_t after = p->epochs - p->epoch - 1;
    double run_left_s = left_s + p->after_s + (double)(after > 0 ? after : 0) * (epoch_s + left_s + p->after_s);
    snprintf(buffer, size, " | epoch %s eta %s | run %s eta %s",
             example_duration_text(epoch_s, elapsed, sizeof elapsed), example_duration_text(left_s, left, sizeof left), run,
             example_duration_text(run_left_s, run_left, sizeof run_left));
}

void example_progress_line_at(example_progress *p, int64_t done, const char *line, double now_s) {
    char times[128];
    example_progress_times(p, done, now_s, times, sizeof times);
    bool last = done >= p->steps;
    if (last) p->train_end_s = now_s;
    if (!p->in_place) {
        fprintf(p->out, "%s%s\n", line, times);
        fflush(p->out);
        return;
    }
    /* Back to the line's start, the line cut to the terminal's width (a line that wrapped would
     * leave its first rows behind), then clear what a longer line before it left. */
    char whole[512];
    snprintf(whole, sizeof whole, "%s%s", line, times);
    int width = p->columns > 1 ? p->columns - 1 : 79;
    fprintf(p->out, "\r%.*s\033[K%s", width, whole, last ? "\n" : "");
    p->line_open = !last;
    fflush(p->out);
}

void example_progress_line(example_progress *p, int64_t done, const char *line) {
    example_progress_line_at(p, done, line, example_seconds());
}

void example_progress_break(example_progress *p) {
    if (!p->in_place || !p->line_open) return;
    fputc('\n', p->out);
    fflush(p->out);
    p->line_open = false;
}
