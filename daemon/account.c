/* What clients make the daemon hold: see account.h. */
#include "account.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "conn.h"
#include "hostmem.h"

/* ---- the client's account ------------------------------------------------------ */

kvd_status_t kvd__account_charge(kvd__conn_t *c, int kind, uint64_t bytes, char *why,
                                 size_t why_len)
{
    kvd__server_t *srv = c->srv;
    uint64_t lim = srv->opts.max_client_memory;
    char a[32], b[32], d[32];
    kvd_status_t st;

    if (bytes > lim || c->held > lim - bytes) {
        srv->hostmem.refused[kind]++;
        snprintf(why, why_len, "%s more of %s would pass this client's limit of %s "
                 "(max-client-memory; it holds %s of leases, requests and key areas)",
                 kvd__fmt_bytes(bytes, a, sizeof(a)), kvd__hostmem_kind_name(kind),
                 kvd__fmt_bytes(lim, b, sizeof(b)), kvd__fmt_bytes(c->held, d, sizeof(d)));
        return KVD_ELIMIT;
    }
    st = kvd__hostmem_reserve(&srv->hostmem, kind, bytes, why, why_len);
    if (st != KVD_OK)
        return st;
    c->held += bytes;
    return KVD_OK;
}

void kvd__account_release(kvd__conn_t *c, int kind, uint64_t bytes)
{
    bytes = bytes < c->held ? bytes : c->held;
    c->held -= bytes;
    kvd__hostmem_release(&c->srv->hostmem, kind, bytes);
}

/* ---- measuring from the wire ---------------------------------------------------- */

/* protobuf-c 1.x's unpacking, as far as what it allocates: the message;
 * past 16 fields on the wire, slabs of scanned members (32 bytes each)
 * doubling from 32 entries, so never more than twice the fields plus 32;
 * an array for each repeated field; a copy of each string (with its NUL)
 * and bytes field; a record and a copy of each unknown field; the same
 * for every nested message. */
#define SCANNED_MEMBER_BYTES 32u
#define UNKNOWN_FIELD_BYTES 32u /* ProtobufCMessageUnknownField, rounded */
/* The protocol nests four deep; deeper is refused. */
#define MEASURE_DEPTH 8
/* Fields counted per message (every message of the protocol has fewer). */
#define MEASURE_FIELDS 128

static uint64_t round_up(uint64_t n)
{
    return (n + KVD_ARENA_ALIGN - 1) & ~(uint64_t)(KVD_ARENA_ALIGN - 1);
}

static int varint(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    uint64_t v = 0;
    int shift;

    for (shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

static size_t element_size(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_SFIXED64: case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_STRING: case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    default: /* 32-bit scalars, enums, protobuf_c_boolean */
        return 4;
    }
}

/* Elements in a packed run of len bytes at p of a numeric field of type t. */
static uint64_t packed_count(ProtobufCType t, const uint8_t *p, uint64_t len)
{
    uint64_t n = 0, i;

    switch (t) {
    case PROTOBUF_C_TYPE_SFIXED64: case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_DOUBLE:
        return len / 8;
    case PROTOBUF_C_TYPE_SFIXED32: case PROTOBUF_C_TYPE_FIXED32: case PROTOBUF_C_TYPE_FLOAT:
        return len / 4;
    case PROTOBUF_C_TYPE_BOOL:
        return len;
    default:
        for (i = 0; i < len; i++)
            n += !(p[i] & 0x80);
        return n;
    }
}

typedef struct measure {
    const kvd__wire_limits_t *lim;
    uint64_t bytes;
    char *why;
    size_t why_len;
} measure_t;

/* Where the measure is: the field names from the request down, as a chain
 * on the stack, written out only when a refusal names it (every request is
 * sized by this pass; few are refused). */
typedef struct measure_path {
    const struct measure_path *up; /* NULL: the request itself */
    const char *name;
} measure_path_t;

static kvd_status_t measure_msg(measure_t *m, const ProtobufCMessageDescriptor *d,
                                const uint8_t *p, const uint8_t *end, int depth,
                                const measure_path_t *path);

/* The path as "a.b.c" ("" for the request), cut to fit len. */
static void path_text(const measure_path_t *path, char *buf, size_t len)
{
    const char *names[MEASURE_DEPTH + 2];
    size_t n = 0;
    int k = 0;

    buf[0] = '\0';
    /* the request's own node has no name: stop below it */
    for (; path != NULL && path->up != NULL && k < MEASURE_DEPTH + 2; path = path->up)
        names[k++] = path->name;
    while (k-- > 0 && n + 1 < len) {
        int w = snprintf(buf + n, len - n, "%s%s", n > 0 ? "." : "", names[k]);

        if (w < 0)
            break;
        n += (size_t)w < len - n ? (size_t)w : len - n - 1;
    }
}

/* why: "path.name: " then what is wrong. */
static kvd_status_t refuse(measure_t *m, kvd_status_t st, const measure_path_t *path,
                           const char *name, const char *what)
{
    char at[160];

    path_text(path, at, sizeof(at));
    snprintf(m->why, m->why_len, "%s%s%s: %s", at, at[0] ? "." : "", name, what);
    return st;
}

static kvd_status_t measure_msg(measure_t *m, const ProtobufCMessageDescriptor *d,
                                const uint8_t *p, const uint8_t *end, int depth,
                                const measure_path_t *path)
{
    uint64_t count[MEASURE_FIELDS];
    uint32_t oneof_seen[MEASURE_FIELDS]; /* field index + 1 of the member given */
    uint64_t fields = 0, unknown = 0;
    char what[120];
    unsigned i;

    if (depth > MEASURE_DEPTH || d->n_fields > MEASURE_FIELDS) {
        char at[160];

        path_text(path, at, sizeof(at));
        snprintf(m->why, m->why_len, "%s nests deeper than the protocol", at);
        return KVD_EPROTO;
    }
    memset(count, 0, sizeof(count[0]) * d->n_fields);
    memset(oneof_seen, 0, sizeof(oneof_seen[0]) * d->n_fields);
    m->bytes += round_up(d->sizeof_message);
    while (p < end) {
        uint64_t key, len = 0, n;
        const ProtobufCFieldDescriptor *f;
        const uint8_t *v;
        unsigned fi;

        if (varint(&p, end, &key) != 0)
            goto bad;
        v = p;
        switch (key & 7) {
        case 0:
            if (varint(&p, end, &len) != 0)
                goto bad;
            len = (uint64_t)(p - v);
            break;
        case 1:
            if (end - p < 8)
                goto bad;
            p += len = 8;
            break;
        case 5:
            if (end - p < 4)
                goto bad;
            p += len = 4;
            break;
        case 2:
            if (varint(&p, end, &len) != 0 || len > (uint64_t)(end - p))
                goto bad;
            v = p;
            p += len;
            break;
        default:
            goto bad; /* groups: protobuf-c refuses them too */
        }
        fields++;
        f = key >> 3 <= UINT32_MAX
                ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3))
                : NULL;
        if (f == NULL) { /* kept by the decoder as an unknown field */
            unknown++;
            m->bytes += round_up((uint64_t)(p - v) + 16);
            continue;
        }
        fi = (unsigned)(f - d->fields);
        if (f->label != PROTOBUF_C_LABEL_REPEATED) {
            if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
                /* the members of one oneof share its case field */
                for (i = 0; i < d->n_fields; i++)
                    if ((d->fields[i].flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
                        d->fields[i].quantifier_offset == f->quantifier_offset &&
                        oneof_seen[i])
                        return refuse(m, KVD_EINVAL, path, f->name,
                                      "a second member of its oneof");
                oneof_seen[fi] = fi + 1;
            } else if (f->type == PROTOBUF_C_TYPE_MESSAGE && count[fi] > 0) {
                return refuse(m, KVD_EINVAL, path, f->name, "a message field given twice");
            }
            count[fi]++;
        } else {
            n = (key & 7) == 2 && f->type != PROTOBUF_C_TYPE_STRING &&
                        f->type != PROTOBUF_C_TYPE_BYTES && f->type != PROTOBUF_C_TYPE_MESSAGE
                    ? packed_count(f->type, v, len)
                    : 1;
            count[fi] += n;
        }
        if (f->type == PROTOBUF_C_TYPE_STRING) {
            m->bytes += round_up(len + 1);
        } else if (f->type == PROTOBUF_C_TYPE_BYTES) {
            m->bytes += round_up(len);
        } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            measure_path_t sub = {path, f->name};
            kvd_status_t st;

            if ((key & 7) != 2)
                goto bad;
            st = measure_msg(m, f->descriptor, v, v + len, depth + 1, &sub);
            if (st != KVD_OK)
                return st;
        }
    }
    for (i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        uint64_t n = count[i];

        if (f->label != PROTOBUF_C_LABEL_REPEATED || n == 0)
            continue;
        if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_BYTES &&
            f->type != PROTOBUF_C_TYPE_MESSAGE) {
            if (n * element_size(f->type) > m->lim->max_packed_bytes) {
                snprintf(what, sizeof(what), "%" PRIu64 " values decode past the %" PRIu64
                         "-byte limit of an inline array (max-inline-bytes)", n,
                         m->lim->max_packed_bytes);
                return refuse(m, KVD_ELIMIT, path, f->name, what);
            }
        } else if (n > m->lim->max_repeated) {
            snprintf(what, sizeof(what), "%" PRIu64 " entries, at most %" PRIu64, n,
                     m->lim->max_repeated);
            return refuse(m, KVD_ELIMIT, path, f->name, what);
        }
        m->bytes += round_up(n * element_size(f->type));
    }
    if (fields > 16)
        m->bytes += (2 * fields + 32) * SCANNED_MEMBER_BYTES;
    m->bytes += unknown * UNKNOWN_FIELD_BYTES;
    return KVD_OK;
bad:
    {
        char at[160];

        path_text(path, at, sizeof(at));
        snprintf(m->why, m->why_len, "%s%sdoes not parse", at, at[0] ? " " : "");
    }
    return KVD_EPROTO;
}

kvd_status_t kvd__wire_measure(const ProtobufCMessageDescriptor *desc, const uint8_t *buf,
                               size_t len, const kvd__wire_limits_t *lim, uint64_t *bytes,
                               uint64_t *id, char *why, size_t why_len)
{
    measure_t m = {lim, 0, why, why_len};
    const measure_path_t top = {NULL, ""};
    const uint8_t *p = buf, *end = buf + len;
    uint64_t key, v;
    kvd_status_t st;

    *id = 0;
    /* the request id first, so that a refusal can name it */
    while (len > 0 && p < end && varint(&p, end, &key) == 0) {
        if (key == (1u << 3 | 0)) {
            if (varint(&p, end, &v) == 0)
                *id = v;
            break;
        }
        if ((key & 7) == 0 ? varint(&p, end, &v) != 0
            : (key & 7) == 1 ? (end - p < 8 ? 1 : (p += 8, 0))
            : (key & 7) == 5 ? (end - p < 4 ? 1 : (p += 4, 0))
            : (key & 7) == 2 ? (varint(&p, end, &v) != 0 || v > (uint64_t)(end - p) ? 1
                                                                                 : (p += v, 0))
                             : 1)
            break;
    }
    why[0] = '\0';
    st = len > 0 ? measure_msg(&m, desc, buf, end, 0, &top) : KVD_OK;
    if (len == 0)
        m.bytes = round_up(desc->sizeof_message);
    *bytes = m.bytes;
    return st;
}

/* ---- the arena ------------------------------------------------------------------- */

struct kvd__arena_chunk {
    struct kvd__arena_chunk *next;
    size_t size; /* mapped bytes, this header included */
};

#define CHUNK_HEADER round_up(sizeof(struct kvd__arena_chunk))

void kvd__arena_init(kvd__arena_t *a, kvd__conn_t *c)
{
    kvd__server_t *srv = c->srv;

    memset(a, 0, sizeof(*a));
    a->conn = c;
    a->cap = UINT64_MAX;
    if (!srv->arena_first_busy) {
        srv->arena_first_busy = 1;
        a->first = a->cur = srv->arena_first;
        a->left = KVD_ARENA_FIRST;
    }
}

/* size bytes of a's, zeroed when zero is set (the decoder writes every
 * byte it asks for: a 32 KiB bytes field is not cleared first). */
static void *arena_take(kvd__arena_t *a, size_t size, int zero)
{
    uint64_t need = round_up(size ? size : 1);
    void *p;

    if (need > a->cap - a->used) {
        a->refusal = KVD_EINTERNAL;
        snprintf(a->why, sizeof(a->why), "decoding needed more than the %" PRIu64 " bytes its "
                 "measure allows", a->cap);
        return NULL;
    }
    if (need > a->left) {
        struct kvd__arena_chunk *ch;
        uint64_t want = a->chunks ? 2 * a->chunks->size : KVD_ARENA_FIRST;
        uint64_t room = a->cap == UINT64_MAX ? UINT64_MAX : a->cap - a->used + CHUNK_HEADER;
        uint64_t page = 4096;

        if (want > room)
            want = room;
        if (want < need + CHUNK_HEADER)
            want = need + CHUNK_HEADER;
        want = (want + page - 1) & ~(page - 1);
        a->refusal = kvd__account_charge(a->conn, KVD_HM_REQUESTS, want, a->why, sizeof(a->why));
        if (a->refusal != KVD_OK)
            return NULL;
        ch = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (ch == MAP_FAILED) {
            kvd__account_release(a->conn, KVD_HM_REQUESTS, want);
            a->refusal = KVD_ENOMEM;
            snprintf(a->why, sizeof(a->why), "out of memory for a request");
            return NULL;
        }
        ch->size = want;
        ch->next = a->chunks;
        a->chunks = ch;
        a->charged += want;
        a->cur = (uint8_t *)ch + CHUNK_HEADER;
        a->left = want - CHUNK_HEADER;
    } else if (zero && a->first != NULL && a->cur >= a->first &&
               a->cur < a->first + KVD_ARENA_FIRST) {
        memset(a->cur, 0, need); /* the server's chunk is reused; mapped ones start zeroed */
    }
    p = a->cur;
    a->cur += need;
    a->left -= need;
    a->used += need;
    return p;
}

void *kvd__arena_alloc(kvd__arena_t *a, size_t size)
{
    return arena_take(a, size, 1);
}

void kvd__arena_deinit(kvd__arena_t *a)
{
    while (a->chunks) {
        struct kvd__arena_chunk *ch = a->chunks;
        a->chunks = ch->next;
        munmap(ch, ch->size);
    }
    if (a->charged)
        kvd__account_release(a->conn, KVD_HM_REQUESTS, a->charged);
    if (a->first != NULL)
        a->conn->srv->arena_first_busy = 0;
    memset(a, 0, sizeof(*a));
}

static void *pb_alloc(void *data, size_t size)
{
    return arena_take(data, size, 0);
}

static void pb_free(void *data, void *p)
{
    (void)data;
    (void)p;
}

void kvd__arena_pb_allocator(kvd__arena_t *a, ProtobufCAllocator *out)
{
    out->alloc = pb_alloc;
    out->free = pb_free;
    out->allocator_data = a;
}
