#include <cstdio>
int main() { std::puts("megakernel"); return 0; }
