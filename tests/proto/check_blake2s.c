/*
 * check_blake2s: kvd__b2s (proto/src/blake2s.c), which chains the block
 * keys of libkvdock and proves the secret between cluster daemons (keyed),
 * against values it did not compute:
 *
 * - RFC 7693 Appendix B: BLAKE2s-256("abc");
 * - unkeyed and keyed digests (keys of 1, 16 and 32 bytes 00 01 02 ...,
 *   messages of 0 to 255 bytes 00 01 02 ... across the 64-byte block
 *   boundaries), written down from Python's hashlib.blake2s(msg, key=key);
 *   the 32-byte key's empty message is the first line of the BLAKE2
 *   reference's blake2s-kat.txt;
 * - the cluster's proof as tests/client/rawpeer.c and daemon/cluster/config.c
 *   build it: key = BLAKE2s(secret), proof = BLAKE2s_key(label || nonce
 *   || nonce), from hashlib the same way.
 *
 * Each message is hashed in one update and in pieces of 1, 7 and 64 bytes.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blake2s.h"

static void unhex(const char *hex, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        ck_assert_int_eq(sscanf(hex + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t)v;
    }
}

/* BLAKE2s of msg[0, n) under key (klen 0: none), fed in pieces of piece
 * bytes (0: in one update). */
static void digest(const uint8_t *key, size_t klen, const uint8_t *msg, size_t n, size_t piece,
                   uint8_t out[KVD_BLAKE2S_BYTES])
{
    kvd__b2s_t s;

    kvd__b2s_init(&s, klen ? key : NULL, klen);
    if (piece == 0) {
        kvd__b2s_update(&s, msg, n);
    } else {
        for (size_t at = 0; at < n; at += piece)
            kvd__b2s_update(&s, msg + at, n - at < piece ? n - at : piece);
    }
    kvd__b2s_final(&s, out);
}

START_TEST(test_rfc7693_abc)
{
    uint8_t want[32], got[32];

    unhex("508c5e8c327c14e2e1a72ba34eeb452f37458b209ed63a294d999b4c86675982", want, 32);
    digest(NULL, 0, (const uint8_t *)"abc", 3, 0, got);
    ck_assert_mem_eq(got, want, 32);
}
END_TEST

static const struct {
    size_t klen, n;
    const char *hex;
} vec[] = {
    {0, 0, "69217a3079908094e11121d042354a7c1f55b6482ca1a51e1b250dfd1ed0eef9"},
    {0, 1, "e34d74dbaf4ff4c6abd871cc220451d2ea2648846c7757fbaac82fe51ad64bea"},
    {0, 3, "e8f91c6ef232a041452ab0e149070cdd7dd1769e75b3a5921be37876c45c9900"},
    {0, 63, "e57cb79487dd57902432b250733813bd96a84efce59f650fac26e6696aefafc3"},
    {0, 64, "56f34e8b96557e90c1f24b52d0c89d51086acf1b00f634cf1dde9233b8eaaa3e"},
    {0, 65, "1b53ee94aaf34e4b159d48de352c7f0661d0a40edff95a0b1639b4090e974472"},
    {0, 128, "1fa877de67259d19863a2a34bcc6962a2b25fcbf5cbecd7ede8f1fa36688a796"},
    {0, 129, "5bd169e67c82c2c2e98ef7008bdf261f2ddf30b1c00f9e7f275bb3e8a28dc9a2"},
    {0, 255, "f03f5789d3336b80d002d59fdf918bdb775b00956ed5528e86aa994acb38fe2d"},
    {1, 0, "cdcf93dac5437c31bf1e79a8398fbbddd1cef4427428ced165264455a9c48a95"},
    {1, 1, "fb57ef20436af865a740fc621af8840ef2eef20f6d36d364ccd2a8aa6c88c593"},
    {1, 3, "8fff22b9f6bc5d1f821b877d21e9351db46ebdfb9c3677a5b55f7f50f8cb90a2"},
    {1, 63, "28e6458ded9053682e04d45cd46e2728469ab1699beee82af0d3fc465aec1404"},
    {1, 64, "efc5e532e4815e7bcc9fc9a685a7b5745cd2cfbc04d37c3442363eb2ca42d0c0"},
    {1, 65, "3ab120e202c7ce80d8e4bd275fcc8cac55198b21840561ff5232c6867b336ec5"},
    {1, 128, "1b3f705bac4e4646c49ba9416708cd47b0ad22cb05224bc4a7265b431db16394"},
    {1, 129, "3e5d8a82b97d9e2fb4f91a64fa3d16907f5d2111214aeb5ad6e060538000b0cc"},
    {1, 255, "57570b66f743f05d9ee800ee467e819b671f2466a047fae445bf53f6b0954d28"},
    {16, 0, "fcfc1128807d157b01adec1ebe0a0927e5ac0ea65000fcec0852218dbb147106"},
    {16, 1, "55085f9908bf12258f944533b26cc7171c7b537b05562d87dd6021f597d2692b"},
    {16, 3, "3c85f7a695b5d7ccce1e84f7e7c24d013545503d3e8f62945894694961bd710d"},
    {16, 63, "306025cb3c58ecf6f013cf53bb2f3ee0821d9e4bedbba529484d42cd2e57727b"},
    {16, 64, "02ba5ce93a26f31312dd2226e48e522df956817d30e797fc3dd232f6bfb5d6a2"},
    {16, 65, "663c663b0a34211816968d004d286d543fcb1707bdde93bbd485cb225436aeff"},
    {16, 128, "ad40caaba7d52b5e44a472da2ba8b9a727afc4983db5d9989dd93c464c9e384a"},
    {16, 129, "70986d3ec0651fecda68c120dc78d198a6a73d92bcced33d5a83f5122a6a3ba7"},
    {16, 255, "172201ff4b7e240167b03ae037ce150d6fdf5fe4edf9e2f0d3b5df2f08c83081"},
    {32, 0, "48a8997da407876b3d79c0d92325ad3b89cbb754d86ab71aee047ad345fd2c49"},
    {32, 1, "40d15fee7c328830166ac3f918650f807e7e01e177258cdc0a39b11f598066f1"},
    {32, 3, "1d220dbe2ee134661fdf6d9e74b41704710556f2f6e5a091b227697445dbea6b"},
    {32, 63, "c65382513f07460da39833cb666c5ed82e61b9e998f4b0c4287cee56c3cc9bcd"},
    {32, 64, "8975b0577fd35566d750b362b0897a26c399136df07bababbde6203ff2954ed4"},
    {32, 65, "21fe0ceb0052be7fb0f004187cacd7de67fa6eb0938d927677f2398c132317a8"},
    {32, 128, "0c311f38c35a4fb90d651c289d486856cd1413df9b0677f53ece2cd9e477c60a"},
    {32, 129, "46a73a8dd3e70f59d3942c01df599def783c9da82fd83222cd662b53dce7dbdf"},
    {32, 255, "3fb735061abc519dfe979e54c1ee5bfad0a9d858b3315bad34bde999efd724dd"},
};

START_TEST(test_vectors)
{
    static const size_t pieces[] = {0, 1, 7, 64};
    uint8_t key[32], msg[255], want[32], got[32];

    for (size_t i = 0; i < sizeof(key); i++)
        key[i] = (uint8_t)i;
    for (size_t i = 0; i < sizeof(msg); i++)
        msg[i] = (uint8_t)i;
    unhex(vec[_i].hex, want, 32);
    for (size_t p = 0; p < sizeof(pieces) / sizeof(pieces[0]); p++) {
        digest(key, vec[_i].klen, msg, vec[_i].n, pieces[p], got);
        ck_assert_msg(memcmp(got, want, 32) == 0,
                      "key of %zu bytes, message of %zu bytes, pieces of %zu: wrong digest",
                      vec[_i].klen, vec[_i].n, pieces[p]);
    }
}
END_TEST

START_TEST(test_cluster_proof)
{
    static const char secret[] = "the cluster's secret, 32 bytes..\n";
    static const char label[] = "kvdock-cluster-1 A";
    uint8_t key[32], a[16], b[16], want[32], got[32];
    kvd__b2s_t s;

    for (int i = 0; i < 16; i++) {
        a[i] = (uint8_t)i;
        b[i] = (uint8_t)(100 + i);
    }
    digest(NULL, 0, (const uint8_t *)secret, strlen(secret), 0, key);
    kvd__b2s_init(&s, key, sizeof(key));
    kvd__b2s_update(&s, label, strlen(label));
    kvd__b2s_update(&s, a, sizeof(a));
    kvd__b2s_update(&s, b, sizeof(b));
    kvd__b2s_final(&s, got);
    unhex("f1064e1d93bac5be54de18328225fe94f61114a39c4b271a16174b462c55b3c1", want, 32);
    ck_assert_mem_eq(got, want, 32);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("blake2s");
    TCase *tc = tcase_create("vectors");
    SRunner *sr;
    int failed;

    tcase_add_test(tc, test_rfc7693_abc);
    tcase_add_loop_test(tc, test_vectors, 0, (int)(sizeof(vec) / sizeof(vec[0])));
    tcase_add_test(tc, test_cluster_proof);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
