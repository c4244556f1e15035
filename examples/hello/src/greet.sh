greet() {
    echo "hello, ${1:-world}"
}
