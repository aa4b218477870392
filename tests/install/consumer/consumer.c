/*
 * A consumer of the installed libkvdock: only <kvdock/client.h>.  Prints
 * a status message, fails to connect to a socket that does not exist,
 * and, given a socket path, connects and pings the daemon there.
 */
#include <stdio.h>
#include <string.h>

#include <kvdock/client.h>

int main(int argc, char **argv)
{
    kvd_client_t *cli = NULL;
    kvd_status_t st;

    printf("strerror(EINVAL)=%s\n", kvd_strerror(KVD_EINVAL));
    st = kvd_client_create("/nonexistent/kvdock-consumer.sock", "consumer", &cli);
    printf("connect(nonexistent)=%s\n", kvd_err_name(st));
    if (st != KVD_ECONN || cli != NULL)
        return 1;
    if (argc > 1) {
        st = kvd_client_create(argv[1], "consumer", &cli);
        if (st != KVD_OK) {
            fprintf(stderr, "connect %s: %s: %s\n", argv[1], kvd_err_name(st),
                    kvd_client_last_error(NULL));
            return 1;
        }
        st = kvd_ping(cli, "hi", 2);
        printf("ping=%s backend=%s\n", kvd_err_name(st),
               kvd_backend_name(kvd_client_info(cli)->backend));
        kvd_client_destroy(&cli);
        if (st != KVD_OK)
            return 1;
    }
    return 0;
}
