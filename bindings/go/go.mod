module courier.dev/courier

go 1.24
