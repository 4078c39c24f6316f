// The translation unit that compiles the tests' precompiled header (tests/CMakeLists.txt,
// cellgate_test_pch): the headers themselves are listed there, not here.
