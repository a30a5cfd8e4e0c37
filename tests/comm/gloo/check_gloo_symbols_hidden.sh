#!/bin/sh
# Checks that libddp.so neither exports nor imports a Gloo symbol when it
# carries a private Gloo (cmake/gloo.cmake, PRIVATE):
#   check_gloo_symbols_hidden.sh NM LIBDDP
# A check that only greps nm's output passes when nm fails or prints
# nothing, so this one also requires nm to succeed and to list the
# library's own ddp:: symbols (proof that it read the right table).
set -u
nm=$1
library=$2
table=$(mktemp "${TMPDIR:-/tmp}/ddp-nm.XXXXXX") || exit 1
trap 'rm -f "$table"' EXIT
if ! "$nm" -DC "$library" >"$table"; then
  echo "FAILED: $nm -DC $library exited with an error"
  exit 1
fi
ddp_symbols=$(grep -c ' ddp::' "$table")
if [ "$ddp_symbols" -lt 100 ]; then
  echo "FAILED: $nm listed only $ddp_symbols ddp:: symbols of $library (expected its API, hundreds)"
  exit 1
fi
if grep 'gloo::' "$table"; then
  echo "FAILED: libddp.so exports or imports the Gloo symbols above"
  exit 1
fi
echo "ok: none of the $(wc -l <"$table") dynamic symbols of $library ($ddp_symbols of them ddp::) is a Gloo symbol"
