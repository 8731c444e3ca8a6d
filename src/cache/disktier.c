/*
 * disktier.c - the disk tier (disktier.h).
 *
 * Owns: the table of known records, the write queue and the writer thread.
 * Borrows: the pool (for the record layout and the rows of a put).
 *
 *   ent[0..n_ent)        one entry per key ever known; live == false once a
 *                        record is deleted or refused (kept as a tombstone
 *                        until the table is rebuilt when half are dead)
 *   slot[0..cap)         open addressing over ent by kp_bkey_h64: 0 empty,
 *                        else entry index + 1; cap a power of two >= 2 n_ent
 *   queue[head..tail)    records waiting for the writer, at most queue_max
 *
 * An entry is QUEUED from put to the rename, then ON_DISK. The LRU order is
 * `stamp` (a logical clock; the scan seeds it from the files' mtimes).
 * An entry is a block record (KEY.kvb) or a recurrent-state snapshot's
 * (KEY.kvs, staterec.h; its key is kp_bkey_state's, never a block's): one
 * table, one budget, one LRU order for both.
 * Invariant: bytes == sum of size over live ON_DISK entries; blocks and
 * states count them by kind, state_bytes the snapshots' part of bytes.
 */
#include "cache/disktier.h"

#include "base/buf.h"
#include "cache/staterec.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

enum { ST_QUEUED = 1, ST_ON_DISK = 2 };
enum { KIND_BLOCK = 0, KIND_STATE = 1 }; /* KEY.kvb, KEY.kvs */

typedef struct {
    kp_bkey key;
    uint64_t size, stamp;
    uint8_t state, kind;
    bool live;
} dent;

typedef struct {
    kp_bkey key;
    uint8_t *rec;
    size_t size;
    uint8_t kind;
} djob;

struct kp_disktier {
    bool keyed;                               /* records are sealed with mac_key */
    uint8_t mac_key[KP_BLOCKREC_KEY_BYTES];
    char dir[4096];  /* DIR/<fingerprint hex> */
    kp_fingerprint fp;
    const kp_kvpool *pool;
    uint64_t budget;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_idle;
    pthread_t writer;
    bool stop, writing, started;
    dent *ent;
    uint32_t n_ent, cap_ent, n_dead;
    uint32_t *slot;
    uint32_t cap_slot;
    djob *queue;
    uint32_t qmax, qhead, qlen;
    uint64_t clock;
    uint8_t *rbuf; /* kp_disk_get's read buffer */
    size_t rcap;
    kp_tier_stats st;
    char note[1024];
};

static void key_path(const kp_disktier *t, const kp_bkey *k, const char *prefix, const char *suffix, char *out,
                     size_t cap) {
    char hex[33];
    kp_bkey_hex(k, hex);
    snprintf(out, cap, "%s/%s%s%s", t->dir, prefix, hex, suffix);
}

static const char *kind_suffix(uint8_t kind) { return kind == KIND_STATE ? ".kvs" : ".kvb"; }

/* Counts an ON_DISK record of `kind` and `size` in (sign +1) or out (-1) of
 * the table's totals. Caller holds mu. */
static void count_record(kp_disktier *t, uint8_t kind, uint64_t size, int sign) {
    uint64_t *n = kind == KIND_STATE ? &t->st.states : &t->st.blocks;
    if (sign > 0) {
        (*n)++;
        t->st.bytes += size;
        if (kind == KIND_STATE) t->st.state_bytes += size;
    } else {
        (*n)--;
        t->st.bytes -= size;
        if (kind == KIND_STATE) t->st.state_bytes -= size;
    }
}

/* The entry of key, or NULL. Caller holds mu. */
static dent *find(kp_disktier *t, const kp_bkey *k) {
    if (!t->cap_slot) return NULL;
    for (uint32_t i = (uint32_t)kp_bkey_h64(k) & (t->cap_slot - 1);; i = (i + 1) & (t->cap_slot - 1)) {
        uint32_t s = t->slot[i];
        if (!s) return NULL;
        if (kp_bkey_eq(&t->ent[s - 1].key, k)) return &t->ent[s - 1];
    }
}

/* Rebuilds the slots over the live entries (dropping the dead) with room
 * for `need` entries. Caller holds mu. */
static bool rehash(kp_disktier *t, uint32_t need) {
    uint32_t w = 0;
    for (uint32_t i = 0; i < t->n_ent; i++)
        if (t->ent[i].live) t->ent[w++] = t->ent[i];
    t->n_ent = w;
    t->n_dead = 0;
    uint32_t cap = 64;
    while (cap < 2 * (need > w ? need : w)) cap *= 2;
    uint32_t *s = calloc(cap, sizeof *s);
    if (!s) return false;
    free(t->slot);
    t->slot = s;
    t->cap_slot = cap;
    for (uint32_t i = 0; i < w; i++) {
        uint32_t j = (uint32_t)kp_bkey_h64(&t->ent[i].key) & (cap - 1);
        while (s[j]) j = (j + 1) & (cap - 1);
        s[j] = i + 1;
    }
    return true;
}

/* Adds (or revives) the entry of key. Caller holds mu. NULL on ENOMEM. */
static dent *add(kp_disktier *t, const kp_bkey *k) {
    dent *d = find(t, k);
    if (d && !d->live) { /* a forgotten key comes back */
        d->live = true;
        d->state = 0;
        d->size = 0;
        t->n_dead--;
    }
    if (d) return d;
    if (t->n_ent == t->cap_ent || 2 * (t->n_ent + 1) > t->cap_slot) {
        if (t->n_dead * 2 > t->n_ent && !rehash(t, t->n_ent + 1)) return NULL;
        if (!kp_grow_u32((void **)&t->ent, &t->cap_ent, t->n_ent + 1, sizeof *t->ent)) return NULL;
        if (2 * (t->n_ent + 1) > t->cap_slot && !rehash(t, 2 * (t->n_ent + 1))) return NULL;
    }
    d = &t->ent[t->n_ent++];
    memset(d, 0, sizeof *d);
    d->key = *k;
    d->live = true;
    uint32_t j = (uint32_t)kp_bkey_h64(k) & (t->cap_slot - 1);
    while (t->slot[j]) j = (j + 1) & (t->cap_slot - 1);
    t->slot[j] = (uint32_t)(d - t->ent) + 1;
    return d;
}

/* Forgets d (its slot stays, pointing at a dead entry). Caller holds mu. */
static void forget(kp_disktier *t, dent *d) {
    if (!d->live) return;
    if (d->state == ST_ON_DISK) count_record(t, d->kind, d->size, -1);
    d->live = false;
    d->state = 0;
    t->n_dead++;
}

/* find() that treats a dead entry as absent. */
static dent *find_live(kp_disktier *t, const kp_bkey *k) {
    dent *d = find(t, k);
    return d && d->live ? d : NULL;
}

/* Deletes least recently used records until bytes + extra fits the
 * budget, sparing `keep`. Caller holds mu. */
static void enforce_budget(kp_disktier *t, uint64_t extra, const dent *keep) {
    if (!t->budget) return;
    while (t->st.bytes + extra > t->budget) {
        dent *old = NULL;
        for (uint32_t i = 0; i < t->n_ent; i++) {
            dent *d = &t->ent[i];
            if (d->live && d->state == ST_ON_DISK && d != keep && (!old || d->stamp < old->stamp)) old = d;
        }
        if (!old) return;
        char path[4200];
        key_path(t, &old->key, "", kind_suffix(old->kind), path, sizeof path);
        unlink(path);
        forget(t, old);
        t->st.evicted++;
    }
}

static bool write_all(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* tmp file, fsync, rename. */
static bool write_record(kp_disktier *t, const djob *j) {
    char tmp[4200], fin[4200];
    key_path(t, &j->key, ".tmp-", "", tmp, sizeof tmp);
    key_path(t, &j->key, "", kind_suffix(j->kind), fin, sizeof fin);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd < 0) return false;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) { /* a FIFO or device left there: not ours */
        close(fd);
        return false;
    }
    bool ok = write_all(fd, j->rec, j->size) && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (ok && rename(tmp, fin) == 0) return true;
    unlink(tmp);
    return false;
}

static void *writer_main(void *arg) {
    kp_disktier *t = arg;
    pthread_setname_np(pthread_self(), "kvpin-disk"); /* ps -L, /proc/PID/task/TID/comm */
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->qlen && !t->stop) pthread_cond_wait(&t->cv_work, &t->mu);
        if (!t->qlen && t->stop) break;
        djob j = t->queue[t->qhead];
        t->qhead = (t->qhead + 1) % t->qmax;
        t->qlen--;
        t->writing = true;
        bool fits = !t->budget || j.size <= t->budget;
        if (fits) enforce_budget(t, j.size, NULL);
        pthread_mutex_unlock(&t->mu);
        bool ok = fits && write_record(t, &j);
        pthread_mutex_lock(&t->mu);
        dent *d = find_live(t, &j.key);
        if (!fits) {
            t->st.dropped_budget++;
            if (d) forget(t, d);
        } else if (!ok) {
            t->st.write_errors++;
            if (d) forget(t, d);
        } else if (d && d->state == ST_QUEUED) {
            d->state = ST_ON_DISK;
            d->size = j.size;
            d->stamp = ++t->clock;
            count_record(t, d->kind, j.size, +1);
            t->st.writes++;
            t->st.bytes_written += j.size;
            enforce_budget(t, 0, d);
        }
        free(j.rec);
        t->writing = false;
        if (!t->qlen) pthread_cond_broadcast(&t->cv_idle);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* Scans our folder: every KEY.kvb and KEY.kvs becomes an ON_DISK entry,
 * stamps in mtime order. */
typedef struct {
    kp_bkey key;
    uint64_t size;
    struct timespec mt;
    uint8_t kind;
} scanned;

static int by_mtime(const void *a, const void *b) {
    const scanned *x = a, *y = b;
    if (x->mt.tv_sec != y->mt.tv_sec) return x->mt.tv_sec < y->mt.tv_sec ? -1 : 1;
    return (x->mt.tv_nsec > y->mt.tv_nsec) - (x->mt.tv_nsec < y->mt.tv_nsec);
}

static kp_status scan_ours(kp_disktier *t, kp_error *err) {
    DIR *d = opendir(t->dir);
    if (!d) return kp_fail(err, KP_EIO, "cannot read the cache directory %s: %s", t->dir, strerror(errno));
    scanned *v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    kp_status st = KP_OK;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        char hex[33];
        if (len != 36 || (strcmp(de->d_name + 32, ".kvb") && strcmp(de->d_name + 32, ".kvs"))) continue;
        memcpy(hex, de->d_name, 32);
        hex[32] = 0;
        scanned s;
        s.kind = strcmp(de->d_name + 32, ".kvs") ? KIND_BLOCK : KIND_STATE;
        if (!kp_bkey_parse(hex, &s.key)) continue;
        struct stat sb;
        if (fstatat(dirfd(d), de->d_name, &sb, 0) != 0 || !S_ISREG(sb.st_mode)) continue;
        s.size = (uint64_t)sb.st_size;
        s.mt = sb.st_mtim;
        if (!kp_grow((void **)&v, &cap, n + 1, sizeof *v)) {
            st = kp_fail(err, KP_ENOMEM, "out of memory scanning %s", t->dir);
            break;
        }
        v[n++] = s;
    }
    closedir(d);
    if (st == KP_OK) {
        if (n) qsort(v, n, sizeof *v, by_mtime);
        for (size_t i = 0; i < n && st == KP_OK; i++) {
            dent *e = add(t, &v[i].key);
            if (!e) {
                st = kp_fail(err, KP_ENOMEM, "out of memory for the disk tier's table");
                break;
            }
            if (e->state == ST_ON_DISK) continue; /* the same key as .kvb and .kvs: not ours, counted once */
            e->state = ST_ON_DISK;
            e->kind = v[i].kind;
            e->size = v[i].size;
            e->stamp = ++t->clock;
            count_record(t, e->kind, v[i].size, +1);
        }
    }
    free(v);
    return st;
}

/* Counts the records of other fingerprints' folders under root and says
 * how they differ from ours. */
static void scan_others(kp_disktier *t, const char *root, const char *ours) {
    DIR *d = opendir(root);
    if (!d) return;
    struct dirent *de;
    size_t o = 0;
    while ((de = readdir(d))) {
        kp_bkey k;
        if (strlen(de->d_name) != 32 || !kp_bkey_parse(de->d_name, &k) || !strcmp(de->d_name, ours)) continue;
        char sub[4200], text[KP_FINGERPRINT_TEXT_MAX] = "";
        snprintf(sub, sizeof sub, "%s/%s", root, de->d_name);
        DIR *s = opendir(sub);
        if (!s) continue;
        uint64_t blocks = 0;
        struct dirent *f;
        while ((f = readdir(s)))
            if (strlen(f->d_name) == 36 && !strcmp(f->d_name + 32, ".kvb")) blocks++;
        closedir(s);
        snprintf(sub, sizeof sub, "%s/%s/FINGERPRINT", root, de->d_name);
        int ffd = open(sub, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        struct stat fsb;
        if (ffd >= 0 && fstat(ffd, &fsb) == 0 && S_ISREG(fsb.st_mode)) {
            ssize_t r = read(ffd, text, sizeof text - 1);
            text[r > 0 ? r : 0] = 0;
        }
        if (ffd >= 0) close(ffd);
        char why[512];
        kp_fingerprint_diff(t->fp.text, text, why, sizeof why);
        t->st.other_blocks += blocks;
        if (o + 1 < sizeof t->note)
            o += (size_t)snprintf(t->note + o, sizeof t->note - o, "%signored %llu blocks of fingerprint %.8s (%s)",
                                  o ? "; " : "", (unsigned long long)blocks, de->d_name, why);
        if (o >= sizeof t->note) o = sizeof t->note - 1;
    }
    closedir(d);
}

static bool mkdir_p(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return false;
            *p = '/';
        }
    return mkdir(tmp, 0755) == 0 || errno == EEXIST;
}

kp_status kp_disk_open(kp_disktier **out, const kp_disk_config *cfg, const kp_fingerprint *fp, const kp_kvpool *p,
                       kp_error *err) {
    *out = NULL;
    if (!cfg || !cfg->dir || !*cfg->dir) return kp_fail(err, KP_EINVAL, "no cache directory given");
    kp_disktier *t = calloc(1, sizeof *t);
    if (!t) return kp_fail(err, KP_ENOMEM, "out of memory for the disk tier");
    t->fp = *fp;
    t->pool = p;
    t->budget = cfg->budget_bytes;
    if (cfg->mac_key) {
        t->keyed = true;
        memcpy(t->mac_key, cfg->mac_key, KP_BLOCKREC_KEY_BYTES);
    }
    t->st.budget_bytes = cfg->budget_bytes;
    t->qmax = cfg->queue_max ? cfg->queue_max : 256;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv_work, NULL);
    pthread_cond_init(&t->cv_idle, NULL);
    char hex[33];
    kp_bkey_hex(&fp->id, hex);
    kp_status st = KP_OK;
    if (snprintf(t->dir, sizeof t->dir, "%s/%s", cfg->dir, hex) >= (int)sizeof t->dir) {
        st = kp_fail(err, KP_EINVAL, "the cache directory path is too long");
        goto fail;
    }
    if (!mkdir_p(t->dir)) {
        st = kp_fail(err, KP_EIO, "cannot make the cache directory %s: %s", t->dir, strerror(errno));
        goto fail;
    }
    char fpath[4200];
    snprintf(fpath, sizeof fpath, "%s/FINGERPRINT", t->dir);
    if (access(fpath, F_OK) != 0) {
        FILE *f = fopen(fpath, "w");
        if (f) {
            fputs(fp->text, f);
            fclose(f);
        }
    }
    t->queue = calloc(t->qmax, sizeof *t->queue);
    if (!t->queue || !rehash(t, 256)) {
        st = kp_fail(err, KP_ENOMEM, "out of memory for the disk tier");
        goto fail;
    }
    if ((st = scan_ours(t, err)) != KP_OK) goto fail;
    scan_others(t, cfg->dir, hex);
    if (t->budget) enforce_budget(t, 0, NULL);
    if (pthread_create(&t->writer, NULL, writer_main, t) != 0) {
        st = kp_fail(err, KP_ENOMEM, "cannot start the disk tier's writer thread");
        goto fail;
    }
    t->started = true;
    *out = t;
    return KP_OK;
fail:
    kp_disk_close(t);
    return st;
}

void kp_disk_close(kp_disktier *t) {
    if (!t) return;
    if (t->started) {
        pthread_mutex_lock(&t->mu);
        t->stop = true;
        pthread_cond_signal(&t->cv_work);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->writer, NULL);
    }
    for (uint32_t i = 0; i < t->qlen; i++) free(t->queue[(t->qhead + i) % t->qmax].rec);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv_work);
    pthread_cond_destroy(&t->cv_idle);
    free(t->queue);
    free(t->ent);
    free(t->slot);
    free(t->rbuf);
    free(t);
}

bool kp_disk_has(kp_disktier *t, const kp_bkey *key) {
    pthread_mutex_lock(&t->mu);
    bool h = find_live(t, key) != NULL;
    pthread_mutex_unlock(&t->mu);
    return h;
}

bool kp_disk_ready(kp_disktier *t, const kp_bkey *key) {
    pthread_mutex_lock(&t->mu);
    dent *d = find_live(t, key);
    bool r = d && d->state == ST_ON_DISK;
    pthread_mutex_unlock(&t->mu);
    return r;
}

/* Whether a record of key and size may be queued (unknown, room in the
 * queue, within the budget); the refusals are counted. */
static bool admit(kp_disktier *t, const kp_bkey *key, size_t size) {
    pthread_mutex_lock(&t->mu);
    bool known = find_live(t, key) != NULL, full = t->qlen == t->qmax, big = t->budget && size > t->budget;
    if (full && !known) t->st.dropped_queue++;
    if (big && !known) t->st.dropped_budget++;
    pthread_mutex_unlock(&t->mu);
    return !(known || full || big);
}

/* Seals rec[0..body) when keyed and queues it (the queue takes rec, else
 * it is freed). True when queued. */
static bool enqueue(kp_disktier *t, const kp_bkey *key, uint8_t kind, uint8_t *rec, size_t body, size_t size) {
    if (t->keyed) kp_blockrec_seal(rec, body, t->mac_key);
    pthread_mutex_lock(&t->mu);
    dent *d = t->qlen < t->qmax ? add(t, key) : NULL;
    if (d && !d->state) {
        d->state = ST_QUEUED;
        d->kind = kind;
        t->queue[(t->qhead + t->qlen) % t->qmax] = (djob){*key, rec, size, kind};
        t->qlen++;
        rec = NULL;
        pthread_cond_signal(&t->cv_work);
    } else if (!d) {
        t->st.dropped_queue++;
    }
    pthread_mutex_unlock(&t->mu);
    bool queued = rec == NULL;
    free(rec);
    return queued;
}

bool kp_disk_put(kp_disktier *t, const kp_bkey *key, const kp_bkey *parent, const int32_t *tokens, int32_t block) {
    size_t body = kp_blockrec_size(t->pool), size = body + (t->keyed ? KP_BLOCKREC_MAC_BYTES : 0);
    if (!admit(t, key, size)) return false;
    uint8_t *rec = malloc(size);
    if (!rec) return false;
    kp_blockrec_encode(rec, t->pool, block, &t->fp.id, key, parent, tokens);
    return enqueue(t, key, KIND_BLOCK, rec, body, size);
}

bool kp_disk_put_state(kp_disktier *t, const kp_bkey *key, const kp_bkey *parent, uint32_t pos, const int32_t *tail,
                       int32_t tail_block, const float *state, uint64_t state_bytes) {
    size_t body = kp_staterec_size(t->pool, pos, state_bytes), size = body + (t->keyed ? KP_BLOCKREC_MAC_BYTES : 0);
    if (!admit(t, key, size)) return false;
    uint8_t *rec = malloc(size);
    if (!rec) return false;
    kp_staterec_encode(rec, t->pool, &t->fp.id, key, parent, pos, tail, tail_block, state, state_bytes);
    return enqueue(t, key, KIND_STATE, rec, body, size);
}

/* pread of exactly n bytes at off: KP_BLOCKREC_OK, TRUNCATED or IO. */
static kp_blockrec_reason pread_all(int fd, uint8_t *b, size_t n, off_t off) {
    for (size_t got = 0; got < n;) {
        ssize_t k = pread(fd, b + got, n - got, off + (off_t)got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return k == 0 ? KP_BLOCKREC_TRUNCATED : KP_BLOCKREC_IO;
        got += (size_t)k;
    }
    return KP_BLOCKREC_OK;
}

/* preadv of iov[0..n) whole from off (in calls of at most IOV_MAX
 * vectors; iov is consumed). */
static kp_blockrec_reason preadv_all(int fd, struct iovec *iov, int n, off_t off) {
    while (n > 0) {
        ssize_t k = preadv(fd, iov, n < IOV_MAX ? n : IOV_MAX, off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return k == 0 ? KP_BLOCKREC_TRUNCATED : KP_BLOCKREC_IO;
        off += k;
        for (size_t left = (size_t)k; left && n;) {
            if (left >= iov->iov_len) {
                left -= iov->iov_len;
                iov++, n--;
            } else {
                iov->iov_base = (uint8_t *)iov->iov_base + left;
                iov->iov_len -= left;
                left = 0;
            }
        }
    }
    return KP_BLOCKREC_OK;
}

/* Reads and verifies record fd of len bytes into block: the head into
 * head[kp_blockrec_head_size], the runs into the block, the checksum there. */
static kp_blockrec_reason read_in_place(kp_disktier *t, int fd, size_t len, const kp_bkey *key, const int32_t *tokens,
                                    kp_kvpool *p, int32_t block) {
    size_t hs = kp_blockrec_head_size(p);
    int n = kp_blockrec_n_runs(p);
    uint8_t *head = malloc(hs);
    struct iovec *iov = malloc((size_t)n * sizeof *iov);
    kp_blockrec_reason r = head && iov ? KP_BLOCKREC_OK : KP_BLOCKREC_IO;
    if (r == KP_BLOCKREC_OK) r = len < hs ? KP_BLOCKREC_TRUNCATED : pread_all(fd, head, hs, 0);
    /* a sealed record: its MAC after the K/V bytes */
    bool sealed = r == KP_BLOCKREC_OK && len >= hs + KP_BLOCKREC_MAC_BYTES && kp_blockrec_sealed(head);
    size_t body = sealed ? len - KP_BLOCKREC_MAC_BYTES : len;
    if (r == KP_BLOCKREC_OK && t->keyed && !sealed) r = KP_BLOCKREC_MAC;
    if (r == KP_BLOCKREC_OK) r = kp_blockrec_check_head(head, body, p, &t->fp.id, key, tokens);
    if (r == KP_BLOCKREC_OK) {
        kp_blockrec_iov(p, block, iov);
        r = preadv_all(fd, iov, n, (off_t)hs);
    }
    uint8_t tag[KP_BLOCKREC_MAC_BYTES];
    if (r == KP_BLOCKREC_OK && t->keyed &&
        (pread_all(fd, tag, sizeof tag, (off_t)body) != KP_BLOCKREC_OK ||
         !kp_blockrec_mac_ok_iov(head, hs, iov, n, tag, t->mac_key)))
        r = KP_BLOCKREC_MAC;
    if (r == KP_BLOCKREC_OK && !kp_blockrec_sum_ok(head, p, block)) r = KP_BLOCKREC_CHECKSUM;
    free(head);
    free(iov);
    return r;
}

/* The buffered read: the whole record into rbuf, verified, then copied. */
static bool rbuf_fit(kp_disktier *t, size_t len);

static kp_blockrec_reason read_buffered(kp_disktier *t, int fd, size_t len, const kp_bkey *key, const int32_t *tokens,
                                    kp_kvpool *p, int32_t block) {
    if (!rbuf_fit(t, len)) return KP_BLOCKREC_IO;
    kp_blockrec_reason r = pread_all(fd, t->rbuf, len, 0);
    size_t body = len;
    if (r == KP_BLOCKREC_OK) r = kp_blockrec_unseal(t->rbuf, len, t->keyed ? t->mac_key : NULL, &body);
    if (r == KP_BLOCKREC_OK) r = kp_blockrec_check(t->rbuf, body, p, &t->fp.id, key, tokens);
    if (r == KP_BLOCKREC_OK) kp_blockrec_load(t->rbuf, p, block);
    return r;
}

static kp_blockrec_reason open_record(kp_disktier *t, const kp_bkey *key, uint8_t kind, int *fd, size_t *len);

/* The first half of a get: counts the lookup; false when KEY has no
 * record of `kind` on disk (unknown, or still queued: nothing more to do).
 * Else opens it: *fd (-1 when it cannot be opened) and *len, *r why not. */
static bool get_open(kp_disktier *t, const kp_bkey *key, uint8_t kind, int *fd, size_t *len, kp_blockrec_reason *r) {
    *fd = -1;
    *len = 0;
    *r = KP_BLOCKREC_MISSING;
    pthread_mutex_lock(&t->mu);
    t->st.lookups++;
    dent *d = find_live(t, key);
    bool on_disk = d && d->state == ST_ON_DISK && d->kind == kind;
    if (!d) t->st.fail[KP_BLOCKREC_MISSING]++;
    pthread_mutex_unlock(&t->mu);
    if (!on_disk) return false;
    *r = open_record(t, key, kind, fd, len);
    return true;
}

/* Opens KEY's record: *fd, *len, or why not. */
static kp_blockrec_reason open_record(kp_disktier *t, const kp_bkey *key, uint8_t kind, int *fd, size_t *len) {
    char path[4200];
    key_path(t, key, "", kind_suffix(kind), path, sizeof path);
    /* only a regular file: a FIFO or a device put in the folder would block
     * the engine thread in open or read, a symbolic link lead elsewhere */
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat sb;
    if (*fd < 0) return errno == ENOENT ? KP_BLOCKREC_MISSING : KP_BLOCKREC_IO;
    if (fstat(*fd, &sb) != 0 || !S_ISREG(sb.st_mode)) return KP_BLOCKREC_IO;
    *len = (size_t)sb.st_size;
    return KP_BLOCKREC_OK;
}

/* The second half: touches a loaded record (its LRU stamp, its mtime),
 * closes fd, counts the hit, or the refusal and forgets the key. */
static kp_blockrec_reason get_close(kp_disktier *t, const kp_bkey *key, int fd, size_t len, kp_blockrec_reason r) {
    if (r == KP_BLOCKREC_OK) futimens(fd, NULL); /* the LRU order survives a restart */
    if (fd >= 0) close(fd);
    pthread_mutex_lock(&t->mu);
    dent *d = find_live(t, key);
    if (r == KP_BLOCKREC_OK) {
        t->st.hits++;
        t->st.bytes_read += len;
        if (d) d->stamp = ++t->clock;
    } else {
        t->st.fail[r]++;
        if (d) forget(t, d);
    }
    pthread_mutex_unlock(&t->mu);
    return r;
}

kp_blockrec_reason kp_disk_get(kp_disktier *t, const kp_bkey *key, const int32_t *tokens, kp_kvpool *p, int32_t block,
                           bool in_place) {
    int fd;
    size_t len;
    kp_blockrec_reason r;
    if (!get_open(t, key, KIND_BLOCK, &fd, &len, &r)) return r;
    if (r == KP_BLOCKREC_OK)
        r = in_place ? read_in_place(t, fd, len, key, tokens, p, block)
                     : read_buffered(t, fd, len, key, tokens, p, block);
    return get_close(t, key, fd, len, r);
}

/* Grows rbuf to len bytes; false when it cannot. */
static bool rbuf_fit(kp_disktier *t, size_t len) {
    if (len <= t->rcap) return true;
    uint8_t *nb = realloc(t->rbuf, len);
    if (!nb) return false;
    t->rbuf = nb;
    t->rcap = len;
    return true;
}

kp_blockrec_reason kp_disk_get_state(kp_disktier *t, const kp_bkey *key, const kp_bkey *parent, uint32_t pos,
                                     const int32_t *tail, kp_kvpool *p, int32_t tail_block, float *state,
                                     uint64_t state_bytes) {
    int fd;
    size_t len;
    kp_blockrec_reason r;
    if (!get_open(t, key, KIND_STATE, &fd, &len, &r)) return r;
    if (r == KP_BLOCKREC_OK) r = rbuf_fit(t, len) ? pread_all(fd, t->rbuf, len, 0) : KP_BLOCKREC_IO;
    size_t body = len;
    if (r == KP_BLOCKREC_OK) r = kp_blockrec_unseal(t->rbuf, len, t->keyed ? t->mac_key : NULL, &body);
    if (r == KP_BLOCKREC_OK)
        r = kp_staterec_check(t->rbuf, body, p, &t->fp.id, key, parent, pos, tail, state_bytes);
    if (r == KP_BLOCKREC_OK) kp_staterec_load(t->rbuf, p, tail_block, state);
    return get_close(t, key, fd, len, r);
}

void kp_disk_flush(kp_disktier *t) {
    pthread_mutex_lock(&t->mu);
    while (t->qlen || t->writing) pthread_cond_wait(&t->cv_idle, &t->mu);
    pthread_mutex_unlock(&t->mu);
}

void kp_disk_get_stats(kp_disktier *t, kp_tier_stats *out) {
    pthread_mutex_lock(&t->mu);
    *out = t->st;
    pthread_mutex_unlock(&t->mu);
}

const char *kp_disk_note(const kp_disktier *t) { return t->note; }
