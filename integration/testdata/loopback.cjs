// Preloaded into a Node.js server under test (node -r): every server it
// starts listens on 127.0.0.1 only, whatever address it asks for, so the
// tests stay on loopback.
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "number" || (typeof args[0] === "string" && /^\d+$/.test(args[0]))) {
    if (typeof args[1] === "string") {
      args[1] = "127.0.0.1";
    } else {
      args.splice(1, 0, "127.0.0.1");
    }
  }
  return listen.apply(this, args);
};
