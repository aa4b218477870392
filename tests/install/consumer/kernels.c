/* A consumer of the installed kernel library: one store on the CPU reference. */
#include <stdio.h>
#include <string.h>

#include <kvdock/kernels.h>

int main(void)
{
    unsigned char k[2][4] = {{1, 2, 3, 4}, {5, 6, 7, 8}}, v[2][4] = {{9, 9, 9, 9}, {7, 7, 7, 7}};
    unsigned char kc[4][4], vc[4][4];
    int32_t loc[2] = {3, 1};
    kvd_store_args_t a;
    kvd_status_t st;

    memset(kc, 0, sizeof(kc));
    memset(vc, 0, sizeof(vc));
    memset(&a, 0, sizeof(a));
    a.k_src = k;
    a.v_src = v;
    a.k_src_stride = a.v_src_stride = a.k_dst_stride = a.v_dst_stride = 4;
    a.k_dst = kc;
    a.v_dst = vc;
    a.num_slots = 4;
    a.loc = loc;
    a.loc_dtype = KVD_DTYPE_I32;
    a.num_tokens = 2;
    a.row_bytes = 4;
    st = kvd_cpu_kv_store(&a, NULL);
    printf("kernels: store=%s k[3][0]=%d v[1][0]=%d\n", kvd_err_name(st), kc[3][0], vc[1][0]);
    return st == KVD_OK && kc[3][0] == 1 && vc[1][0] == 7 ? 0 : 1;
}
