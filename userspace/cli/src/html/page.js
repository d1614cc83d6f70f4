"use strict";
// The page works without this script; it switches the rings, shows each
// device's card under the pointer and highlights the device a finding or
// an event lane names.
document.querySelectorAll("input[data-ring]").forEach(function (box) {
  var rings = document.querySelectorAll('#tree g.ring[data-ring="' + box.dataset.ring + '"]');
  function apply() {
    rings.forEach(function (ring) { ring.classList.toggle("hidden", !box.checked); });
  }
  box.addEventListener("change", apply);
  apply();
});

function placeCard(card, event) {
  var x = event.clientX + 16, y = event.clientY + 16;
  var width = card.offsetWidth, height = card.offsetHeight;
  if (x + width > window.innerWidth) { x = Math.max(0, event.clientX - width - 16); }
  if (y + height > window.innerHeight) { y = Math.max(0, event.clientY - height - 16); }
  card.style.left = x + "px";
  card.style.top = y + "px";
}

document.querySelectorAll("#tree g.device").forEach(function (node) {
  var card = document.getElementById(node.dataset.card);
  node.addEventListener("mouseenter", function (event) {
    card.classList.add("shown");
    placeCard(card, event);
  });
  node.addEventListener("mousemove", function (event) { placeCard(card, event); });
  node.addEventListener("mouseleave", function () { card.classList.remove("shown"); });
});

document.querySelectorAll("[data-device]").forEach(function (item) {
  var node = document.querySelector('#tree g.device[data-bdf="' + CSS.escape(item.dataset.device) + '"]');
  if (node === null) { return; }
  item.addEventListener("mouseenter", function () { node.classList.add("highlight"); });
  item.addEventListener("mouseleave", function () { node.classList.remove("highlight"); });
});
