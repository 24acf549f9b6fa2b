/* C API of the trainguard client; same contract as trainguard/client.h. */
#ifndef TRAINGUARD_C_API_H_
#define TRAINGUARD_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Returns 1 if attached to an agent, 0 if running without one. */
int tg_init(void);
void tg_step(int64_t step);
void tg_set_phase(const char* name);
void tg_checkpoint_committed(int64_t step);
void tg_add_checkpoint_overhead(int64_t nanos);
void tg_shutdown(void);

#ifdef __cplusplus
}
#endif

#endif /* TRAINGUARD_C_API_H_ */
