// Anchor for the benchmarks' shared precompiled header (bench/CMakeLists.txt).
