/* A program outside gradsync's tree, built against the installed libgradsync (through the
 * CMake package or pkg-config): joins a job of WORLD_SIZE ranks and checks one allreduce. */
#include <gradsync/gradsync.h>

#include <stdio.h>

int main(void) {
  gradsync_options options = {0};
  gradsync_comm* comm = NULL;
  if (gradsync_options_from_env(&options) != GRADSYNC_OK ||
      gradsync_connect(&options, &comm) != GRADSYNC_OK) {
    fprintf(stderr, "consumer: %s\n", gradsync_last_error(NULL));
    return 1;
  }
  float* values = NULL; /* the daemon reads and writes registered shared memory only */
  gradsync_result result = gradsync_alloc(comm, 4 * sizeof(float), (void**)&values);
  if (result == GRADSYNC_OK) result = gradsync_register(comm, values, 4 * sizeof(float));
  gradsync_request request = 0;
  if (result == GRADSYNC_OK) {
    for (int i = 0; i < 4; ++i) values[i] = (float)(i + 1);
    result = gradsync_allreduce(comm, "values", values, values, 4, GRADSYNC_FLOAT32,
                                GRADSYNC_SUM, &request);
  }
  if (result == GRADSYNC_OK) result = gradsync_wait(comm, request);
  if (result != GRADSYNC_OK) {
    fprintf(stderr, "consumer: %s\n", gradsync_last_error(comm));
    gradsync_disconnect(comm);
    return 1;
  }
  int status = 0;
  for (int i = 0; i < 4; ++i) {
    if (values[i] != (float)((i + 1) * options.world_size)) status = 1;
  }
  printf("consumer rank %d: allreduce %s (API version %d)\n", options.rank,
         status == 0 ? "right" : "WRONG", GRADSYNC_API_VERSION);
  gradsync_disconnect(comm);
  return status;
}
