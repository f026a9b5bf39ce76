/*
 * core/data/image_folder.c — image folders as samples: root/<class>/<file>.png|jpg|jpeg|bmp.
 *
 * Opening scans the folders: each file named like an image is read and checked, and its header
 * read (umt_image_open: a regular file, its bytes, its size and channels), so a bad file is
 * reported before training starts, by name; the pixels are decoded later, one sample at a time,
 * by the loader's threads (never on the compute path). A file whose header is fine but whose
 * body does not decode is then an error of the loader's next batch, naming the file.
 *
 * With skip_bad the scan decodes every file too (as the loader would, resize included), so that
 * a file that does not decode is skipped there and counted with the others: a skip is decided
 * once, before training, and an epoch never meets a file it cannot read (unless the file changes
 * after the scan). That costs a decode of each file at the scan, which only skip_bad asks for.
 * Each skipped file counts once, in the split it was in: with train/ and test/ folders, the
 * folder's; otherwise the training split's (the split is made after the scan, of good files).
 *
 * The split: with root/train/ and root/test/ folders, those; otherwise every class's files,
 * sorted by name, go to test at a steady rate of test_fraction (stratified, the same every run).
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "core/base/error.h"
#include "core/data/image_format.h"
#include "core/data/samples.h"

typedef struct {
    char *path;
    int32_t label;
} image_file;

typedef struct {
    image_file *files;
    int64_t count, slots;
} file_list;

typedef struct {
    umt_samples base;
    file_list list;
} folder_samples;

/* The files (and empty class folders) a split skipped, and the message of the first. */
typedef struct {
    int64_t count;
    char *first;
} skips;

/* What a scan is asked for, and what it has found out so far. */
typedef struct {
    const umt_image_folder_options *options;
    int channels; /* 0 until the first readable file when options->channels is 0 */
    char **class_names;
    int class_count;
    skips train_skips, test_skips;
    skips *skips; /* the split being scanned */
    unsigned char *pixels; /* skip_bad: where the scan decodes each file, options' size in colour */
} scan_state;

/* ----------------------------------------------------------------------------------------- */
/* Folders */

/* dir/name into out (PATH_BYTES), or an error when it does not fit. */
#define PATH_BYTES 4096
static umt_status join_path(char *out, const char *dir, const char *name) {
    int n = snprintf(out, PATH_BYTES, "%s/%s", dir, name);
    if (n < 0 || n >= PATH_BYTES)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s/%s: path longer than %d bytes", dir, name, PATH_BYTES - 1);
    return UMT_OK;
}

static bool is_image_name(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot && (!strcasecmp(dot, ".png") || !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg") ||
                   !strcasecmp(dot, ".bmp"));
}

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void free_names(char **names, int count) {
    for (int i = 0; names && i < count; ++i) free(names[i]);
    free(names);
}

/* The sorted names in dir of sub-folders (dirs) or of entries named like an image file (!dirs,
 * whatever they are: a folder named x.png is then refused by name, not passed over); hidden names
 * skipped. */
static umt_status list_dir(const char *dir, bool dirs, char ***out, int *count) {
    *out = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return umt_fail(UMT_ERR_IO, "%s: cannot open the folder (%s)", dir, strerror(errno));
    char **names = NULL, path[PATH_BYTES];
    int n = 0, slots = 0;
    umt_status status = UMT_OK;
    for (struct dirent *e = readdir(d); e && status == UMT_OK; e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        status = join_path(path, dir, e->d_name);
        if (status != UMT_OK) break;
        if (dirs ? !is_dir(path) : !is_image_name(e->d_name)) continue;
        if (n == slots) {
            slots = slots ? 2 * slots : 64;
            char **grown = realloc(names, (size_t)slots * sizeof *grown);
            if (!grown) status = umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: no memory for the file names", dir);
            else names = grown;
        }
        if (status == UMT_OK && !(names[n++] = strdup(e->d_name)))
            status = umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: no memory for the file names", dir);
    }
    closedir(d);
    if (status != UMT_OK) {
        free_names(names, n);
        return status;
    }
    if (n > 1) qsort(names, (size_t)n, sizeof *names, compare_names);
    *out = names;
    *count = n;
    return UMT_OK;
}

static umt_status list_push(file_list *list, const char *path, int32_t label) {
    if (list->count == list->slots) {
        int64_t slots = list->slots ? 2 * list->slots : 256;
        image_file *grown = realloc(list->files, (size_t)slots * sizeof *grown);
        if (!grown) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "image folder: no memory for %lld files", (long long)slots);
        list->files = grown;
        list->slots = slots;
    }
    char *copy = strdup(path);
    if (!copy) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "image folder: no memory for %s", path);
    list->files[list->count++] = (image_file){copy, label};
    return UMT_OK;
}

static void list_free(file_list *list) {
    for (int64_t i = 0; i < list->count; ++i) free(list->files[i].path);
    free(list->files);
    *list = (file_list){0};
}

/* ----------------------------------------------------------------------------------------- */
/* Checking files */

/* A bad file or folder: with skip_bad it is counted in the split's skips (the first message
 * kept) and UMT_OK returned with *skip set; otherwise the failure is returned. */
static umt_status bad(scan_state *scan, bool *skip, umt_status status) {
    if (!scan->options->skip_bad) return status;
    if (!scan->skips->first) scan->skips->first = strdup(umt_last_error());
    scan->skips->count++;
    *skip = true;
    return UMT_OK;
}

/* Grey with or without alpha is one channel; colour with or without alpha is three. */
static umt_status check_channels(scan_state *scan, const char *path, int file_channels) {
    int channels = file_channels <= 2 ? 1 : 3;
    if (!scan->channels) scan->channels = channels;
    if (channels != scan->channels)
        return umt_fail(UMT_ERR_FORMAT, "%s: %s image (%d channels), expected %s (%d channel%s)", path,
                        channels == 1 ? "a grey" : "a colour", file_channels, scan->channels == 1 ? "grey" : "colour",
                        scan->channels, scan->channels == 1 ? "" : "s");
    return UMT_OK;
}

/* Reads and checks the file: a regular file, a PNG/JPEG/BMP of sane size, with the right
 * channels; with skip_bad, decoded as the loader will. */
static umt_status check_file(scan_state *scan, const char *path) {
    umt_image_file file;
    UMT_TRY(umt_image_open(path, &file));
    umt_status status = check_channels(scan, path, file.channels);
    const umt_image_folder_options *o = scan->options;
    if (status == UMT_OK && o->skip_bad)
        status = umt_image_decode(path, &file, scan->channels, o->height, o->width, scan->pixels);
    umt_image_close(&file);
    return status;
}

/* The good files of one class folder, labelled. */
static umt_status scan_class(scan_state *scan, const char *dir, int32_t label, file_list *out) {
    char **names = NULL, path[PATH_BYTES];
    int count = 0;
    UMT_TRY(list_dir(dir, false, &names, &count));
    umt_status status = UMT_OK;
    int64_t good = 0;
    for (int i = 0; i < count && status == UMT_OK; ++i) {
        bool skip = false;
        status = join_path(path, dir, names[i]);
        if (status == UMT_OK) status = check_file(scan, path);
        if (status != UMT_OK) status = bad(scan, &skip, status);
        if (status == UMT_OK && !skip) status = list_push(out, path, label), good++;
    }
    free_names(names, count);
    if (status == UMT_OK && good == 0) {
        bool skip = false;
        status = bad(scan, &skip, umt_fail(UMT_ERR_FORMAT, "class folder %s has no readable PNG, JPEG or BMP file", dir));
    }
    return status;
}

/* Every class folder of dir (which must be among the scan's classes) into out. */
static umt_status scan_split(scan_state *scan, const char *dir, file_list *out) {
    char **names = NULL, path[PATH_BYTES];
    int count = 0;
    UMT_TRY(list_dir(dir, true, &names, &count));
    umt_status status = count ? UMT_OK : umt_fail(UMT_ERR_FORMAT, "%s: no class folders in it", dir);
    for (int i = 0; i < count && status == UMT_OK; ++i) {
        int label = 0;
        while (label < scan->class_count && strcmp(scan->class_names[label], names[i])) label++;
        status = join_path(path, dir, names[i]);
        if (status != UMT_OK) break;
        if (label == scan->class_count)
            status = umt_fail(UMT_ERR_FORMAT, "%s: class %s is not among the training classes", path, names[i]);
        else status = scan_class(scan, path, label, out);
    }
    free_names(names, count);
    return status;
}

/* ----------------------------------------------------------------------------------------- */
/* Decoding (in the loader's threads) */

static umt_status folder_read(const umt_samples *base, int64_t index, uint8_t *pixels, int32_t *label) {
    const folder_samples *s = (const folder_samples *)base;
    const image_file *file = &s->list.files[index];
    /* Every check again: the file may have changed since the scan. */
    UMT_TRY(umt_image_read(file->path, (int)base->chw[0], (int)base->chw[1], (int)base->chw[2], pixels));
    *label = file->label;
    return UMT_OK;
}

static void folder_destroy(umt_samples *base) {
    folder_samples *s = (folder_samples *)base;
    list_free(&s->list);
    free(s);
}

static const umt_samples_ops folder_ops = {.read = folder_read, .destroy = folder_destroy};

/* Samples of one split (named split, for messages) over list (taken over, emptied), with a copy
 * of the class names and the split's skips (taken over). */
static umt_status make_samples(const scan_state *scan, const char *split, file_list *list, skips *skipped,
                               umt_samples **out) {
    const umt_image_folder_options *o = scan->options;
    folder_samples *s = calloc(1, sizeof *s);
    char **names = calloc((size_t)scan->class_count, sizeof *names);
    size_t name_bytes = strlen(split) + strlen(o->root) + 32;
    char *name = malloc(name_bytes);
    bool ok = s && names && name;
    for (int i = 0; ok && i < scan->class_count; ++i) ok = (names[i] = strdup(scan->class_names[i])) != NULL;
    if (!ok) {
        free_names(names, scan->class_count);
        free(name);
        free(s);
        return umt_fail(UMT_ERR_OUT_OF_MEMORY, "image folder %s: no memory", o->root);
    }
    snprintf(name, name_bytes, "the %s split of image folder %s", split, o->root);
    s->base = (umt_samples){.ops = &folder_ops, .size = list->count, .chw = {scan->channels, o->height, o->width},
                            .num_classes = scan->class_count, .class_names = names, .name = name,
                            .skipped = skipped->count, .first_skip = skipped->first};
    *skipped = (skips){0};
    s->list = *list;
    *list = (file_list){0};
    *out = &s->base;
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* Opening */

/* Moves every file of all into train or test: of each class's files (in name order), the one
 * that carries the running count of test files past a whole number goes to test. */
static umt_status split_by_fraction(file_list *all, double fraction, file_list *train, file_list *test) {
    umt_status status = UMT_OK;
    for (int64_t i = 0, in_class = 0; i < all->count && status == UMT_OK; ++i, ++in_class) {
        if (i > 0 && all->files[i].label != all->files[i - 1].label) in_class = 0;
        bool to_test = (int64_t)((double)(in_class + 1) * fraction) > (int64_t)((double)in_class * fraction);
        status = list_push(to_test ? test : train, all->files[i].path, all->files[i].label);
    }
    return status;
}

static umt_status check_options(const umt_image_folder_options *o) {
    if (!o || !o->root) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_image_folder_open: options and root must be set");
    if ((o->channels != 0 && o->channels != 1 && o->channels != 3) || o->height < 1 || o->width < 1 ||
        o->height > UMT_IMAGE_MAX_SIDE || o->width > UMT_IMAGE_MAX_SIDE || !(o->test_fraction >= 0 && o->test_fraction < 1))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT,
                        "image folder %s: channels %d, size %dx%d, test fraction %g: expected channels 0, 1 or 3, "
                        "1..%d pixels a side, a fraction in [0, 1)",
                        o->root, o->channels, o->height, o->width, o->test_fraction, UMT_IMAGE_MAX_SIDE);
    return UMT_OK;
}

/* Scans root (or root/train and root/test) into the two lists. */
static umt_status scan_root(scan_state *scan, file_list *train, file_list *test) {
    const char *root = scan->options->root;
    char train_dir[PATH_BYTES], test_dir[PATH_BYTES];
    UMT_TRY(join_path(train_dir, root, "train"));
    UMT_TRY(join_path(test_dir, root, "test"));
    bool split_folders = is_dir(train_dir) && is_dir(test_dir);
    UMT_TRY(list_dir(split_folders ? train_dir : root, true, &scan->class_names, &scan->class_count));
    if (scan->class_count == 0) return umt_fail(UMT_ERR_FORMAT, "image folder %s: no class folders in it", root);
    scan->skips = &scan->train_skips;
    if (split_folders) {
        UMT_TRY(scan_split(scan, train_dir, train));
        scan->skips = &scan->test_skips;
        return scan_split(scan, test_dir, test);
    }
    file_list all = {0};
    umt_status status = scan_split(scan, root, &all);
    if (status == UMT_OK) status = split_by_fraction(&all, scan->options->test_fraction, train, test);
    list_free(&all);
    return status;
}

umt_status umt_image_folder_open(const umt_image_folder_options *options, umt_samples **train, umt_samples **test) {
    if (train) *train = NULL;
    if (test) *test = NULL;
    if (!options || !train) return umt_fail_null("umt_image_folder_open", options ? "train" : "options");
    UMT_TRY(check_options(options));
    scan_state scan = {.options = options, .channels = options->channels};
    size_t sample_bytes = (size_t)options->height * (size_t)options->width * 3;
    if (options->skip_bad && !(scan.pixels = malloc(sample_bytes)))
        return umt_fail(UMT_ERR_OUT_OF_MEMORY, "image folder %s: no memory for a %dx%d image", options->root,
                        options->width, options->height);
    file_list train_list = {0}, test_list = {0};
    umt_status status = scan_root(&scan, &train_list, &test_list);
    if (status == UMT_OK && train_list.count == 0)
        status = umt_fail(UMT_ERR_FORMAT, "image folder %s: no training images", options->root);
    if (status == UMT_OK) status = make_samples(&scan, "training", &train_list, &scan.train_skips, train);
    if (status == UMT_OK && test) status = make_samples(&scan, "test", &test_list, &scan.test_skips, test);
    if (status != UMT_OK) {
        umt_samples_destroy(*train);
        *train = NULL;
    }
    list_free(&train_list);
    list_free(&test_list);
    free_names(scan.class_names, scan.class_count);
    free(scan.train_skips.first);
    free(scan.test_skips.first);
    free(scan.pixels);
    return status;
}
