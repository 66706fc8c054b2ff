# Warnings for the project's own host code (interface target; link it PRIVATE).
add_library(zo_warnings INTERFACE)
target_compile_options(zo_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>)
