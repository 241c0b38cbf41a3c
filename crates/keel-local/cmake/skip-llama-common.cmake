# Included by CMake after every project() call of the llama.cpp build that llama-cpp-sys-2
# runs (CMAKE_PROJECT_INCLUDE, set in .cargo/config.toml; llama-cpp-sys-2 forwards CMAKE_*
# variables to CMake). It turns off llama.cpp's `common` library: llama-cpp-2 enables
# llama-cpp-sys-2's default `common` feature with no way for a dependent to switch it off,
# Keel uses nothing of it (keel-local builds llama-cpp-2 without its `common` feature),
# and its 53 C++ files were over a third of llama.cpp's build time. llama-cpp-sys-2 links
# the library only when it was built, so nothing else changes.
if(PROJECT_NAME STREQUAL "llama.cpp")
  set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)
endif()
