# tests: nn/nn
