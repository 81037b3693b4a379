// toolgate console: optional enhancements. Every action works without this
// file; it only adds copy-to-clipboard buttons.
"use strict";
document.addEventListener("click", function (event) {
  var button = event.target.closest("button.copy");
  if (!button) return;
  var source = document.getElementById(button.dataset.copy);
  if (!source || !navigator.clipboard) return;
  navigator.clipboard.writeText(source.textContent).then(function () {
    var label = button.textContent;
    button.textContent = "Copied";
    setTimeout(function () { button.textContent = label; }, 1500);
  });
});
// Copy buttons mean nothing without script: they are shown only with it.
document.documentElement.classList.add("js");
