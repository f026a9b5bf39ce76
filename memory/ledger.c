/*
 * memory/ledger.c — the GPU's ledger (ledger.h): a file of fixed layout, updated under its lock.
 *
 * The file is a 64-byte header (magic, version, slot count, umtrain's capacity on the GPU) and
 * UMT_LEDGER_SLOTS slots of 32 bytes (pid, bytes). Every reading and update of it happens with
 * the header's bytes locked, so the table a holder reads and the entry it writes are one step.
 *
 * Which slots are alive: each holder keeps a lock on its own slot's bytes for as long as it
 * lives, and a slot whose lock is gone is dead and dropped. The locks are open file description
 * (OFD) locks, which the kernel holds for the open file and drops when its last descriptor closes,
 * as it does when the process ends, however it ends (SIGKILL included). So liveness does not rest
 * on the pid: a reused pid cannot keep a dead entry alive, and a holder in another pid namespace
 * (a container sharing the directory) is seen alive although its pid means nothing here. A pid
 * with /proc's start time would survive pid reuse but not namespaces. Not classic POSIX locks:
 * they belong to the process, so two contexts of one process would not exclude each other, and
 * closing any descriptor of the file would drop all of the process's locks on it. Not flock():
 * it locks whole files only. One caveat: a child forked after a context was made shares its open
 * file, so its entry lives until both have exited (O_CLOEXEC keeps programs it execs out).
 */
#define _GNU_SOURCE /* F_OFD_SETLK, F_OFD_GETLK: the locks of an open file description */
#include "memory/ledger.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/base/error.h"

#define LEDGER_MAGIC "umtledg1"
#define LEDGER_VERSION 1
#define LEDGER_KEY_MAX 64
/* How long an update waits for the lock: its holders keep it for microseconds (no CUDA call runs
 * under it), so only a stopped or stuck process keeps it longer, and waiting on one forever would
 * hang this process too. */
#define LEDGER_WAIT_MS 5000

_Static_assert(sizeof(size_t) == sizeof(uint64_t), "the file's 64-bit byte counts are read as size_t");

typedef struct {
    char magic[8];
    uint32_t version, slot_count;
    uint64_t capacity_bytes;
    uint8_t unused[40];
} ledger_header;

typedef struct {
    int64_t pid; /* 0 with bytes 0: a free slot */
    uint64_t bytes;
    uint8_t unused[16];
} ledger_slot;

typedef struct {
    ledger_header header;
    ledger_slot slots[UMT_LEDGER_SLOTS];
} ledger_table;

_Static_assert(sizeof(ledger_header) == 64 && sizeof(ledger_slot) == 32, "the file's layout has no padding");
_Static_assert(sizeof(ledger_table) == 64 + 32 * UMT_LEDGER_SLOTS, "the file's layout has no padding");

struct umt_ledger {
    int fd;
    int slot;              /* this holder's slot, -1 before it has one */
    size_t own_bytes;      /* the truth of this holder's entry: every write puts it in the file */
    size_t capacity_bytes; /* the last capacity read, for a file rebuilt under a live holder */
    ledger_table table;    /* the last table read */
    char path[4096];
};

static size_t add_saturating(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }

static off_t slot_offset(int slot) { return (off_t)(sizeof(ledger_header) + (size_t)slot * sizeof(ledger_slot)); }

const char *umt_ledger_dir(void) {
    const char *dir = getenv("UMT_LEDGER_DIR");
    if (dir && *dir) return dir;
    /* Memory, not disk, where the machine has it; a container without it still has /tmp. */
    struct stat st;
    return stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";
}

const char *umt_ledger_path(const umt_ledger *ledger) { return ledger ? ledger->path : ""; }

/* ----------------------------------------------------------------------------------------- */
/* Locks: the header's for every update, a slot's for its holder's life */

/* An OFD lock of type on [start, start + length) (length 0: to the end of the file and beyond);
 * 0 or errno. */
static int lock_range(int fd, int command, short type, off_t start, off_t length) {
    struct flock lock = {.l_type = type, .l_whence = SEEK_SET, .l_start = start, .l_len = length};
    return fcntl(fd, command, &lock) == 0 ? 0 : errno;
}

/* Takes the header's lock, polling: F_OFD_SETLKW would wait forever behind a stopped process. */
static int lock_table(umt_ledger *l) {
    long waited_us = 0, pause_us = 100;
    for (;;) {
        int e = lock_range(l->fd, F_OFD_SETLK, F_WRLCK, 0, sizeof(ledger_header));
        if (!e) return 0;
        if (e != EAGAIN && e != EACCES && e != EINTR) return e;
        if (waited_us >= (long)LEDGER_WAIT_MS * 1000) return ETIMEDOUT;
        nanosleep(&(struct timespec){0, pause_us * 1000}, NULL);
        waited_us += pause_us;
        pause_us = pause_us < 10000 ? 2 * pause_us : pause_us;
    }
}

static void unlock_table(umt_ledger *l) { lock_range(l->fd, F_OFD_SETLK, F_UNLCK, 0, sizeof(ledger_header)); }

static umt_status lock_failure(const umt_ledger *l, int e) {
    if (e == ETIMEDOUT)
        return umt_fail(UMT_ERR_IO, "ledger %s: another process has held its lock for %d ms (a stopped process?)",
                        l->path, LEDGER_WAIT_MS);
    return umt_fail(UMT_ERR_IO, "ledger %s: cannot lock it: %s (open file description locks need Linux 3.15+)",
                    l->path, strerror(e));
}

/* Whether another open file holds a lock on [start, start + length) (length 0: to the end). */
static umt_status locked_elsewhere(const umt_ledger *l, off_t start, off_t length, bool *locked) {
    struct flock lock = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = start, .l_len = length};
    if (fcntl(l->fd, F_OFD_GETLK, &lock) != 0)
        return umt_fail(UMT_ERR_IO, "ledger %s: cannot test its locks: %s", l->path, strerror(errno));
    *locked = lock.l_type != F_UNLCK;
    return UMT_OK;
}

/* Whether any slot but this holder's is locked, whatever the file holds: what decides if a file
 * that is not a ledger may be rebuilt. */
static umt_status any_other_alive(const umt_ledger *l, bool *alive) {
    off_t first = slot_offset(0);
    if (l->slot < 0) return locked_elsewhere(l, first, 0, alive);
    UMT_TRY(locked_elsewhere(l, first, slot_offset(l->slot) - first, alive));
    return *alive ? UMT_OK : locked_elsewhere(l, slot_offset(l->slot + 1), 0, alive);
}

/* ----------------------------------------------------------------------------------------- */
/* The table: read, checked, rebuilt, swept of the dead */

static umt_status write_at(const umt_ledger *l, const void *bytes, size_t size, off_t offset) {
    ssize_t written = pwrite(l->fd, bytes, size, offset);
    if (written == (ssize_t)size) return UMT_OK;
    return umt_fail(UMT_ERR_IO, "ledger %s: cannot write %zu bytes at %lld: %s", l->path, size, (long long)offset,
                    written < 0 ? strerror(errno) : "short write");
}

static umt_status write_own(umt_ledger *l) {
    l->table.slots[l->slot] = (ledger_slot){.pid = (int64_t)getpid(), .bytes = l->own_bytes};
    return write_at(l, &l->table.slots[l->slot], sizeof(ledger_slot), slot_offset(l->slot));
}

/* Reads the table into l->table; why gets what makes the file no ledger of this layout ("" when
 * it is one). Only the layout's size is ever read, whatever the file's size. */
static umt_status read_table(umt_ledger *l, char *why, size_t size) {
    struct stat st;
    if (fstat(l->fd, &st) != 0) return umt_fail(UMT_ERR_IO, "ledger %s: cannot stat: %s", l->path, strerror(errno));
    why[0] = 0;
    if (st.st_size != (off_t)sizeof l->table) {
        snprintf(why, size, "%lld bytes, expected %zu", (long long)st.st_size, sizeof l->table);
        return UMT_OK;
    }
    ssize_t got = pread(l->fd, &l->table, sizeof l->table, 0);
    if (got < 0) return umt_fail(UMT_ERR_IO, "ledger %s: cannot read: %s", l->path, strerror(errno));
    const ledger_header *h = &l->table.header;
    if (got != (ssize_t)sizeof l->table) snprintf(why, size, "%zd bytes read, expected %zu", got, sizeof l->table);
    else if (memcmp(h->magic, LEDGER_MAGIC, sizeof h->magic)) snprintf(why, size, "no umtrain ledger's magic");
    else if (h->version != LEDGER_VERSION) snprintf(why, size, "version %u, expected %d", h->version, LEDGER_VERSION);
    else if (h->slot_count != UMT_LEDGER_SLOTS)
        snprintf(why, size, "%u slots, expected %d", h->slot_count, UMT_LEDGER_SLOTS);
    return UMT_OK;
}

/* A fresh table with capacity, this holder's entry in it when it has one. */
static umt_status rebuild(umt_ledger *l, size_t capacity) {
    memset(&l->table, 0, sizeof l->table);
    memcpy(l->table.header.magic, LEDGER_MAGIC, sizeof l->table.header.magic);
    l->table.header.version = LEDGER_VERSION;
    l->table.header.slot_count = UMT_LEDGER_SLOTS;
    l->table.header.capacity_bytes = capacity;
    if (l->slot >= 0) l->table.slots[l->slot] = (ledger_slot){.pid = (int64_t)getpid(), .bytes = l->own_bytes};
    if (ftruncate(l->fd, (off_t)sizeof l->table) != 0)
        return umt_fail(UMT_ERR_IO, "ledger %s: cannot size it: %s", l->path, strerror(errno));
    return write_at(l, &l->table, sizeof l->table, 0);
}

/* The table, checked: a file that is not a ledger is rebuilt with capacity when nobody else is
 * alive in it, and refused while someone is (their entries cannot be read back). */
static umt_status load(umt_ledger *l, size_t capacity) {
    char why[96];
    UMT_TRY(read_table(l, why, sizeof why));
    if (!why[0]) return UMT_OK;
    bool alive = false;
    UMT_TRY(any_other_alive(l, &alive));
    if (alive)
        return umt_fail(UMT_ERR_FORMAT,
                        "ledger %s: not a umtrain ledger (%s) while another process holds a slot in it: refused, "
                        "its holders cannot be counted (remove the file once no umtrain process uses this GPU)",
                        l->path, why);
    return rebuild(l, capacity);
}

static void note_other(umt_ledger_view *v, int64_t pid, size_t bytes) {
    v->others_bytes = add_saturating(v->others_bytes, bytes);
    int n = v->other_count < UMT_LEDGER_SHOWN ? v->other_count : UMT_LEDGER_SHOWN - 1;
    if (v->other_count >= UMT_LEDGER_SHOWN && bytes <= v->others[n].bytes) {
        v->other_count++;
        return;
    }
    /* Insertion into the largest-first list, the smallest falling off the end when it is full. */
    while (n > 0 && v->others[n - 1].bytes < bytes) {
        v->others[n] = v->others[n - 1];
        n--;
    }
    v->others[n] = (umt_ledger_holder){pid, bytes};
    v->other_count++;
}

/* Drops the entries of dead holders (their slots unlocked) from the file, and sums the others. */
static umt_status sweep(umt_ledger *l, umt_ledger_view *v) {
    *v = (umt_ledger_view){.capacity_bytes = l->table.header.capacity_bytes, .own_bytes = l->own_bytes};
    for (int i = 0; i < UMT_LEDGER_SLOTS; ++i) {
        ledger_slot *s = &l->table.slots[i];
        if (i == l->slot || (!s->pid && !s->bytes)) continue;
        bool alive = false;
        UMT_TRY(locked_elsewhere(l, slot_offset(i), sizeof *s, &alive));
        if (alive) {
            note_other(v, s->pid, s->bytes);
            continue;
        }
        *s = (ledger_slot){0};
        UMT_TRY(write_at(l, s, sizeof *s, slot_offset(i)));
    }
    l->capacity_bytes = v->capacity_bytes;
    return UMT_OK;
}

/* Read, checked and swept: the state every decision starts from (the lock held). */
static umt_status refresh(umt_ledger *l, size_t capacity_if_rebuilt, umt_ledger_view *v) {
    UMT_TRY(load(l, capacity_if_rebuilt));
    return sweep(l, v);
}

/* ----------------------------------------------------------------------------------------- */
/* Joining and leaving */

static bool key_char_ok(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' || c == '_' ||
           c == '.';
}

/* The key becomes part of a file name: nothing that could leave the directory or hide the file. */
static umt_status check_key(const char *dir, const char *key) {
    if (!dir || !*dir)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_ledger_open: the directory is %s", dir ? "empty" : "NULL");
    size_t n = key ? strlen(key) : 0;
    bool ok = n > 0 && n <= LEDGER_KEY_MAX && key[0] != '.';
    for (size_t i = 0; ok && i < n; ++i) ok = key_char_ok(key[i]);
    if (ok) return UMT_OK;
    return umt_fail(UMT_ERR_INVALID_ARGUMENT,
                    "umt_ledger_open: key '%.80s': expected 1 to %d letters, digits, '-', '_' or '.' (not first)",
                    key ? key : "(null)", LEDGER_KEY_MAX);
}

static const char *kind_of(mode_t mode) {
    return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO" : S_ISCHR(mode) ? "a character device"
         : S_ISBLK(mode) ? "a block device" : S_ISSOCK(mode) ? "a socket" : "not a regular file";
}

/* Opens the file read-write, made when missing. Not O_CREAT on an existing file: in a sticky
 * directory such as /dev/shm, Linux's protected_regular refuses that for another user's file. Not
 * through a symbolic link: one planted in a shared directory would point the writes at any file. */
static umt_status open_file(umt_ledger *l) {
    const int flags = O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
    int fd = -1;
    for (int attempt = 0; attempt < 3 && fd < 0; ++attempt) {
        fd = open(l->path, flags);
        if (fd >= 0 || errno != ENOENT) break;
        fd = open(l->path, flags | O_CREAT | O_EXCL, 0666);
        /* Every user's processes share the GPU: the file is theirs too, whatever the umask. */
        if (fd >= 0) (void)!fchmod(fd, 0666); /* a file left to the umask still works for this user */
        else if (errno != EEXIST) break; /* EEXIST: another process made it first; open that one */
    }
    if (fd < 0 && errno == ELOOP)
        return umt_fail(UMT_ERR_IO, "ledger %s: a symbolic link, refused (expected a regular file)", l->path);
    if (fd < 0) return umt_fail(UMT_ERR_IO, "ledger %s: cannot open: %s (UMT_LEDGER_DIR names the directory)",
                                l->path, strerror(errno));
    struct stat st;
    umt_status status = UMT_OK;
    if (fstat(fd, &st) != 0) status = umt_fail(UMT_ERR_IO, "ledger %s: cannot stat: %s", l->path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        status = umt_fail(UMT_ERR_IO, "ledger %s: %s, not a regular file", l->path, kind_of(st.st_mode));
    if (status != UMT_OK) close(fd);
    else l->fd = fd;
    return status;
}

/* A free slot locked for this holder, its entry written. */
static umt_status claim_slot(umt_ledger *l) {
    for (int i = 0; i < UMT_LEDGER_SLOTS; ++i) {
        const ledger_slot *s = &l->table.slots[i];
        /* A slot zeroed by someone while its holder lives keeps its lock: the lock fails, next. */
        if (s->pid || s->bytes || lock_range(l->fd, F_OFD_SETLK, F_WRLCK, slot_offset(i), sizeof *s)) continue;
        l->slot = i;
        return write_own(l);
    }
    return umt_fail(UMT_ERR_BUDGET, "ledger %s: all %d slots are held by live holders", l->path, UMT_LEDGER_SLOTS);
}

/* Under the lock: the table checked and swept, the capacity recorded when nobody else is alive,
 * a slot claimed. */
static umt_status join(umt_ledger *l, size_t capacity_if_first, umt_ledger_view *view) {
    UMT_TRY(refresh(l, capacity_if_first, view));
    if (!view->other_count && l->table.header.capacity_bytes != capacity_if_first) {
        l->table.header.capacity_bytes = capacity_if_first;
        UMT_TRY(write_at(l, &l->table.header, sizeof l->table.header, 0));
        view->capacity_bytes = l->capacity_bytes = capacity_if_first;
    }
    return claim_slot(l);
}

umt_status umt_ledger_open(const char *dir, const char *key, size_t free_bytes, size_t headroom_bytes,
                           umt_ledger **out, umt_ledger_view *view) {
    if (!out || !view) return umt_fail_null("umt_ledger_open", out ? "view" : "out");
    *out = NULL;
    UMT_TRY(check_key(dir, key));
    umt_ledger *l = calloc(1, sizeof *l);
    if (!l) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_ledger_open: no memory for the handle");
    *l = (umt_ledger){.fd = -1, .slot = -1};
    int n = snprintf(l->path, sizeof l->path, "%s/umtrain-ledger-%s", dir, key);
    umt_status st = n > 0 && (size_t)n < sizeof l->path
                        ? UMT_OK
                        : umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_ledger_open: directory '%.200s...' too long", dir);
    if (st == UMT_OK) st = open_file(l);
    int e = st == UMT_OK ? lock_table(l) : 0;
    if (e) st = lock_failure(l, e);
    if (st == UMT_OK) {
        st = join(l, free_bytes > headroom_bytes ? free_bytes - headroom_bytes : 0, view);
        unlock_table(l);
    }
    if (st != UMT_OK) {
        if (l->fd >= 0) close(l->fd);
        free(l);
        return st;
    }
    *out = l;
    return UMT_OK;
}

void umt_ledger_close(umt_ledger *ledger) {
    if (!ledger) return;
    /* The entry is zeroed under the lock; were that not possible, closing drops the slot's lock,
     * and the next holder to look drops the entry as a dead one's. */
    if (ledger->slot >= 0 && !lock_table(ledger)) {
        ledger->table.slots[ledger->slot] = (ledger_slot){0};
        ssize_t written = pwrite(ledger->fd, &ledger->table.slots[ledger->slot], sizeof(ledger_slot),
                                 slot_offset(ledger->slot));
        (void)written; /* not written: dropped as a dead holder's, as above */
        unlock_table(ledger);
    }
    close(ledger->fd);
    free(ledger);
}

/* ----------------------------------------------------------------------------------------- */
/* Reserving, releasing, looking */

void umt_ledger_describe_others(const umt_ledger_view *view, char *text, size_t size) {
    if (!size) return;
    text[0] = 0;
    if (!view->other_count) {
        snprintf(text, size, "none");
        return;
    }
    size_t used = 0, listed_bytes = 0;
    int listed = view->other_count < UMT_LEDGER_SHOWN ? view->other_count : UMT_LEDGER_SHOWN;
    for (int i = 0; i < listed && used < size; ++i) {
        const umt_ledger_holder *h = &view->others[i];
        bool here = h->pid == (int64_t)getpid();
        int n = snprintf(text + used, size - used, "%spid %lld%s: %zu bytes", i ? ", " : "", (long long)h->pid,
                         here ? " (this process)" : "", h->bytes);
        used += n > 0 ? (size_t)n : 0;
        listed_bytes = add_saturating(listed_bytes, h->bytes);
    }
    if (view->other_count > listed && used < size)
        snprintf(text + used, size - used, ", %d more: %zu bytes", view->other_count - listed,
                 view->others_bytes - listed_bytes);
}

/* Rules (b) and (c) for a request, on a fresh view; the refusal's message. */
static umt_status decide(const umt_ledger *l, const umt_ledger_view *v, size_t request, size_t free_bytes,
                         size_t guard_bytes) {
    char others[448];
    size_t held = add_saturating(v->others_bytes, v->own_bytes);
    size_t usable = free_bytes > guard_bytes ? free_bytes - guard_bytes : 0;
    if (add_saturating(held, request) > v->capacity_bytes) {
        umt_ledger_describe_others(v, others, sizeof others);
        return umt_fail(UMT_ERR_BUDGET,
                        "request of %zu bytes refused: umtrain's capacity on this GPU is %zu bytes (ledger %s); other "
                        "holders: %s (%zu bytes together); this context holds %zu; %zu left",
                        request, v->capacity_bytes, l->path, others, v->others_bytes, v->own_bytes,
                        held < v->capacity_bytes ? v->capacity_bytes - held : 0);
    }
    if (request > usable) {
        umt_ledger_describe_others(v, others, sizeof others);
        return umt_fail(UMT_ERR_BUDGET,
                        "request of %zu bytes refused: the GPU has %zu bytes free now, of which %zu are kept free: "
                        "other programs took memory since umtrain's capacity (%zu bytes) was measured (ledger %s; "
                        "other umtrain holders: %s)",
                        request, free_bytes, guard_bytes, v->capacity_bytes, l->path, others);
    }
    return UMT_OK;
}

umt_status umt_ledger_reserve(umt_ledger *ledger, size_t request_bytes, size_t free_bytes, size_t guard_bytes) {
    if (!ledger) return umt_fail_null("umt_ledger_reserve", "ledger");
    int e = lock_table(ledger);
    if (e) return lock_failure(ledger, e);
    umt_ledger_view v;
    umt_status st = refresh(ledger, ledger->capacity_bytes, &v);
    if (st == UMT_OK) st = decide(ledger, &v, request_bytes, free_bytes, guard_bytes);
    if (st == UMT_OK) {
        ledger->own_bytes += request_bytes; /* within the capacity: no overflow */
        st = write_own(ledger);
        if (st != UMT_OK) ledger->own_bytes -= request_bytes;
    }
    unlock_table(ledger);
    return st;
}

void umt_ledger_release(umt_ledger *ledger, size_t bytes) {
    if (!ledger) return;
    ledger->own_bytes = bytes < ledger->own_bytes ? ledger->own_bytes - bytes : 0;
    /* Only this holder's slot is written: no message is set, so a release on a failure's way
     * out (a context destroyed after its creation failed) keeps the message that says why. */
    if (lock_table(ledger)) return;
    ledger->table.slots[ledger->slot] = (ledger_slot){.pid = (int64_t)getpid(), .bytes = ledger->own_bytes};
    ssize_t written = pwrite(ledger->fd, &ledger->table.slots[ledger->slot], sizeof(ledger_slot),
                             slot_offset(ledger->slot));
    (void)written; /* not written: the higher count stays until the next update */
    unlock_table(ledger);
}

umt_status umt_ledger_look(umt_ledger *ledger, umt_ledger_view *out) {
    if (!ledger || !out) return umt_fail_null("umt_ledger_look", ledger ? "out" : "ledger");
    int e = lock_table(ledger);
    if (e) return lock_failure(ledger, e);
    umt_status st = refresh(ledger, ledger->capacity_bytes, out);
    unlock_table(ledger);
    return st;
}

void umt_ledger_print(umt_ledger *ledger, FILE *out) {
    umt_ledger_view v;
    if (umt_ledger_look(ledger, &v) != UMT_OK) {
        fprintf(out, "GPU ledger: %s\n", umt_last_error());
        return;
    }
    char others[512];
    umt_ledger_describe_others(&v, others, sizeof others);
    fprintf(out, "GPU ledger %s: umtrain's capacity %zu bytes, this context %zu, other holders: %s\n", ledger->path,
            v.capacity_bytes, v.own_bytes, others);
}
