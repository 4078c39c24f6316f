# Warnings are errors in cellgate's own code; third-party headers are included as SYSTEM by
# their imported targets, so they do not trip these.
function(cellgate_warnings target)
  target_compile_options(${target} PRIVATE
    -Wall -Wextra -Wpedantic -Werror
    -Wshadow -Wnon-virtual-dtor -Wold-style-cast -Wcast-align -Wunused -Woverloaded-virtual
    -Wnull-dereference -Wimplicit-fallthrough -Wformat=2)
endfunction()
