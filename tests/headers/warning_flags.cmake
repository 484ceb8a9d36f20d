# The warnings a demanding user builds with, which specdec's headers must not draw: the "headers: strict warnings"
# test and the packaging test's consumer project both use this list.
set(specdec_strict_warnings -Wall -Wextra -Wpedantic -Wconversion -Wsign-conversion -Wshadow -Wold-style-cast
  -Wdouble-promotion -Wcast-align -Wnon-virtual-dtor -Woverloaded-virtual -Wnull-dereference -Wimplicit-fallthrough
  -Wformat=2)
