# Warnings are errors in cellgate's own code; third-party headers are included as SYSTEM by
# their imported targets, so they do not trip these. (-Wnull-dereference is left out: g++ 12
# reports false positives from inlined libstdc++ code at -O2.)
function(cellgate_warnings target)
  target_compile_options(${target} PRIVATE
    -Wall -Wextra -Wpedantic -Werror
    -Wshadow -Wnon-virtual-dtor -Wold-style-cast -Wcast-align -Wunused -Woverloaded-virtual
    -Wimplicit-fallthrough -Wformat=2)
endfunction()
