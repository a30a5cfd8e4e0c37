# Sourced by the shell tests that need a free port (tests/comm/init_exit_sweep.sh,
# tests/comm/rendezvous_progress.sh, and the launcher tests: slurm_cases.sh's
# daemons, torchrun_elastic.sh's rendezvous, pytorchjob_env.sh's master).
#
#   free_port PYTHON   prints a free TCP port below the kernel's ephemeral
#                      range (32768 and up here), so that no socket of a test
#                      running beside this one (Gloo's pairs bind ephemeral
#                      ports) takes it between this check and rank 0's bind
free_port() {
  "$1" -c '
import random, socket
while True:
    port = random.randint(15000, 32000)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        print(port)
        break
    except OSError:
        pass
    finally:
        s.close()'
}
