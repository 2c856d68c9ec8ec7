#!/bin/sh
# Entry point of every fractune container (Ray head, Ray workers, MLflow server): runs its arguments.
#
# Ray token authentication: a token given without RAY_AUTH_MODE means token mode on this node too.
# `ray start --head` turns token auth on by itself when it finds a token, `ray start --address` does not,
# and a worker without it cannot join a head that requires it. An explicit RAY_AUTH_MODE is left alone.
# The token itself is never printed.
set -eu
if [ -n "${RAY_AUTH_TOKEN:-}" ] && [ -z "${RAY_AUTH_MODE:-}" ]; then
  RAY_AUTH_MODE=token
  export RAY_AUTH_MODE
fi
exec "$@"
