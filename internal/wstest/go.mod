module github.com/talaris-go/talaris/internal/wstest

go 1.26.0

require (
	github.com/coder/websocket v1.8.15
	github.com/gorilla/websocket v1.5.3
)

require github.com/talaris-go/talaris v0.0.0

replace github.com/talaris-go/talaris => ../..
